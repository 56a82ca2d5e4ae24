import { readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { afterAll, describe, expect, it, vi } from "vitest";
import { checkHealth } from "../src/health.ts";
import { summarizeJob } from "../src/queue.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { RECALL, say } from "./helpers/recall.ts";
import { processTree } from "./helpers/server-process.ts";
import { until } from "./helpers/until.ts";

// Processes start slowly on a loaded machine: generous limits (behaviour, not speed, is tested).
vi.setConfig({ testTimeout: 300_000, hookTimeout: 300_000 });

// /healthz asks each part (store, queue, Chroma) and says what it found; /readyz adds whether
// the server takes traffic. The embedded children are supervised: PGlite is restarted, and a
// Chroma whose process is killed with SIGKILL leaves nothing behind and comes back once.

const engrams: TestEngram[] = [];
afterAll(async () => {
  for (const engram of engrams) await engram.stop().catch(() => {});
});

async function start(env: Record<string, string> = {}, options: { chromaStartRetryMs?: number } = {}) {
  const engram = await startTestEngram({ env, ...options });
  engrams.push(engram);
  const url = await engram.listen();
  return { engram, url };
}

const get = async (url: string) => {
  const response = await fetch(url);
  return { status: response.status, body: await response.json() };
};

/** Child processes of this test process whose command line contains all the given words. */
const childrenNaming = (...words: string[]) =>
  processTree(process.pid).filter((pid) => {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      return pid !== process.pid && words.every((word) => cmd.includes(word));
    } catch {
      return false;
    }
  });

describe("/healthz and /readyz", () => {
  it("report each component, and a store that died until it is back", async () => {
    const { engram, url } = await start();
    const ok = await get(`${url}/healthz`);
    expect(ok.status).toBe(200);
    expect(ok.body.status).toBe("ok");
    expect(Object.keys(ok.body.components).sort()).toEqual(["chroma", "queue", "store", "work"]);
    expect((await get(`${url}/readyz`)).body.ready).toBe(true);
    if (engram.store.kind !== "embedded") return;

    const dir = engram.store.vars.ENGRAM_DATA_DIR;
    const [child] = childrenNaming("pglite-child", dir);
    process.kill(child, "SIGKILL");
    const down = await until("/healthz to report the store down", async () => {
      const health = await get(`${url}/healthz`);
      return health.status === 503 ? health : undefined;
    }, 20_000);
    expect(down.body.components.store.status).toBe("down");
    expect((await get(`${url}/readyz`)).status).toBe(503);
    await until("/healthz to be ok again", async () => (await get(`${url}/healthz`)).status === 200, 60_000);
    expect((await engram.gql("{ viewer { role } }")).data.viewer.role).toBe("ADMIN");
  });

  it("say degraded, not down, when Chroma does not answer", async () => {
    const { url } = await start({ CHROMA_URL: "http://127.0.0.1:9" });
    const health = await get(`${url}/healthz`);
    expect(health.status).toBe(200);
    expect(health.body.status).toBe("degraded");
    expect(health.body.components.chroma.status).toBe("down");
    // It answers without a key: it says which part, never the address.
    expect(health.body.components.chroma.detail).toBe("no heartbeat from the external Chroma (CHROMA_URL)");
    expect(JSON.stringify(health.body)).not.toContain("127.0.0.1");
  });

  it("say degraded while due work waits more than 5 minutes for a worker, and ok once it is taken", async () => {
    const { engram, url } = await start();
    const conversationId = `late-${Date.now()}`;
    await engram.services.queue.enqueue(summarizeJob, { tenantId: engram.tenant.tenantId, conversationId });
    const late = (minutes: number) =>
      engram.services.db.$executeRawUnsafe(
        `UPDATE "agenda_jobs" SET "next_run_at" = now() - $1 * interval '1 minute' WHERE "data"->>'conversationId' = $2`,
        minutes,
        conversationId,
      );
    await late(2); // late, but within the 5 minutes a busy queue may take
    expect((await get(`${url}/healthz`)).body).toMatchObject({ status: "ok", components: { work: { status: "ok" } } });
    await late(12);
    const health = await get(`${url}/healthz`);
    expect(health.status).toBe(200); // the API answers: degraded, not down
    expect(health.body).toMatchObject({ status: "degraded", components: { work: { status: "down", detail: expect.stringMatching(/^1 job\(s\) due for up to 12 min have not started/) } } });
    expect((await get(`${url}/readyz`)).body).toMatchObject({ ready: true, status: "degraded" });
    // A worker busy with a backlog (another job finished a minute ago) is taking work.
    await engram.services.queue.enqueue(summarizeJob, { tenantId: engram.tenant.tenantId, conversationId: `${conversationId}-done` });
    await engram.services.db.$executeRawUnsafe(
      `UPDATE "agenda_jobs" SET "next_run_at" = NULL, "last_finished_at" = now() - interval '1 minute' WHERE "data"->>'conversationId' = $1`,
      `${conversationId}-done`,
    );
    expect((await get(`${url}/healthz`)).body).toMatchObject({ status: "ok", components: { work: { status: "ok" } } });
    await engram.services.db.$executeRawUnsafe(`DELETE FROM "agenda_jobs" WHERE "data"->>'conversationId' = $1`, `${conversationId}-done`);
    expect((await get(`${url}/healthz`)).body).toMatchObject({ status: "degraded" });
    // A worker took it (its lock): nothing is late.
    await engram.services.db.$executeRawUnsafe(`UPDATE "agenda_jobs" SET "locked_at" = now() WHERE "data"->>'conversationId' = $1`, conversationId);
    expect((await get(`${url}/healthz`)).body).toMatchObject({ status: "ok", components: { work: { status: "ok" } } });
    // A lock its worker stopped renewing past the lock lifetime (the worker was killed, and none
    // runs now) is no sign of life: the job waits, and no worker takes work.
    await engram.services.db.$executeRawUnsafe(
      `UPDATE "agenda_jobs" SET "locked_at" = now() - $1 * interval '1 millisecond' - interval '1 minute' WHERE "data"->>'conversationId' = $2`,
      engram.services.deps.env.ENGRAM_JOB_LOCK_MS,
      conversationId,
    );
    expect((await get(`${url}/healthz`)).body).toMatchObject({ status: "degraded", components: { work: { status: "down", detail: expect.stringMatching(/^1 job\(s\) due/) } } });
  });

  it("say that a check failed, not the failure's own words, which the log has", async () => {
    const warnings: unknown[] = [];
    const health = await checkHealth({
      store: { state: () => "up", kind: "postgres" },
      query: () => Promise.reject(new Error("connect ECONNREFUSED 10.0.4.7:5432")),
      queue: { ping: async () => {} },
      chroma: { health: async () => ({ status: "ok" }) },
      log: { warn: (_message: string, fields?: object) => void warnings.push((fields as { error?: unknown } | undefined)?.error) },
    });
    expect(health).toMatchObject({ status: "down", components: { store: { status: "down", detail: "the check failed (the server's log has the error)" } } });
    expect(JSON.stringify(health)).not.toContain("10.0.4.7");
    expect(warnings).toEqual([new Error("connect ECONNREFUSED 10.0.4.7:5432")]);
  });

  it("say the embedded store is down when its disk has no room for writes, which a query alone does not show", async () => {
    const store = { state: () => "up" as const, kind: "embedded" as const };
    const others = { query: async () => 1, queue: { ping: async () => {} }, chroma: { health: async () => ({ status: "ok" as const }) } };
    // A disk filled to 4 KB free: every append failed with "No space left on device" while SELECT 1 answered and this said ok.
    const full = await checkHealth({ store, ...others, freeBytes: async () => 4_096 });
    expect(full).toMatchObject({ status: "down", components: { store: { status: "down", detail: "the data folder's disk has 0 MB free: writes fail until space is freed" } } });
    expect(await checkHealth({ store, ...others, freeBytes: async () => 2 ** 30 })).toMatchObject({ status: "ok", components: { store: { status: "ok" } } });
  });

  it("report Redis when REDIS_URL is set: down while the pubsub has no connection, which degrades", async () => {
    const parts = {
      store: { state: () => "up" as const, kind: "postgres" as const },
      query: async () => 1,
      queue: { ping: async () => {} },
      chroma: { health: async () => ({ status: "ok" as const }) },
    };
    const local = await checkHealth({ ...parts, pubsub: { mode: () => "local", probe: async () => "answers" as const } });
    expect(local).toEqual({ status: "ok", components: { store: expect.anything(), queue: { status: "ok" }, chroma: { status: "ok" } } });
    expect((await checkHealth({ ...parts, pubsub: { mode: () => "redis", probe: async () => "answers" as const } })).components.redis).toEqual({ status: "ok" });
    const down = await checkHealth({ ...parts, pubsub: { mode: () => "degraded", probe: async () => "unreachable" as const } });
    expect(down).toMatchObject({ status: "degraded", components: { redis: { status: "down", detail: expect.stringMatching(/no connection/) } } });
    // Connected, but no answer to a PING: down too.
    const silent = await checkHealth({ ...parts, pubsub: { mode: () => "redis", probe: async () => "silent" as const } });
    expect(silent).toMatchObject({ status: "degraded", components: { redis: { status: "down", detail: expect.stringMatching(/does not answer/) } } });
  });

  it("say Redis is down and degraded when REDIS_URL names a Redis that does not answer", async () => {
    const { url } = await start({ REDIS_URL: "redis://127.0.0.1:1" });
    const health = await get(`${url}/healthz`);
    expect(health.status).toBe(200);
    expect(health.body.status).toBe("degraded");
    expect(health.body.components.redis.status).toBe("down");
    expect(JSON.stringify(health.body)).not.toContain("127.0.0.1");
  });
});

describe("the embedded Chroma", () => {
  // On the embedded store, Chroma's server is a thread of the database's process (one process
  // fewer); on PostgreSQL it is a process of its own. Either way, a crash leaves nothing behind,
  // /healthz says so, and Chroma comes back once, never twice.
  it("killed with SIGKILL leaves no process behind and is started again once", async () => {
    const { engram, url } = await start();
    const dir = engram.store.vars.ENGRAM_DATA_DIR;
    const hosted = engram.store.kind === "embedded";
    const hostOf = () => childrenNaming(hosted ? "pglite-child" : "chroma-child", dir);
    const first = await engram.services.chroma.get();
    expect(first.pid).toBeDefined();
    expect(hostOf()).toEqual([first.pid]);
    if (hosted) expect(childrenNaming("chroma-child")).toEqual([]);
    process.kill(first.pid!, "SIGKILL");
    await until("the Chroma host to be gone", async () => !hostOf().includes(first.pid!) && !first.alive(), 10_000);
    // Two callers at once after the crash: one new server (on the embedded store, in the
    // database's new process, once that is back).
    const [a, b] = await Promise.all([engram.services.chroma.get(), engram.services.chroma.get()]);
    expect(a.pid).toBe(b.pid);
    expect(a.pid).not.toBe(first.pid);
    expect(hostOf()).toEqual([a.pid]);
    if (hosted) expect(childrenNaming("chroma-child")).toEqual([]);
    await until("/healthz to be ok", async () => (await get(`${url}/healthz`)).status === 200, 60_000);
    expect((await get(`${url}/healthz`)).body.components.chroma.status).toBe("ok");

    // Killed again, with nothing asking for it: the health check that finds it gone starts it.
    process.kill(a.pid!, "SIGKILL");
    await until("the Chroma host to be gone again", async () => !hostOf().includes(a.pid!) && !a.alive(), 10_000);
    expect((await get(`${url}/healthz`)).body.components.chroma).toEqual({ status: "down", detail: "the embedded Chroma exited; it is being started again" });
    await until("/healthz to say Chroma is up again on its own", async () => (await get(`${url}/healthz`)).body.components.chroma.status === "ok", 60_000);
    expect(hostOf()).toHaveLength(1);
  });

  it("that cannot start is reported down until it does, not as starting on first use", async () => {
    const { engram, url } = await start({}, { chromaStartRetryMs: 1_000 });
    // Its folder is taken by a file: every start fails (EEXIST).
    writeFileSync(path.join(engram.store.vars.ENGRAM_DATA_DIR, "chroma"), "not a folder");
    expect((await get(`${url}/healthz`)).body.components.chroma).toEqual({ status: "ok", detail: "embedded; starts on first use" });
    const { endUserId } = await say(engram, { user: "uma", conversation: "u-1" }, "I booked the quiet room.", "Booked.");
    const recall = await engram.gql(RECALL, { input: { endUserId, text: "quiet room" } });
    expect(recall.data.recall.degraded).toMatch(/vector search unavailable/);
    const health = await get(`${url}/healthz`);
    expect(health.status).toBe(200);
    expect(health.body.status).toBe("degraded");
    expect(health.body.components.chroma).toEqual({
      status: "down",
      detail: "the embedded Chroma failed to start (EEXIST); it is tried again on next use, and by a health check every 1 s",
    });
    expect(JSON.stringify(health.body)).not.toContain(engram.store.vars.ENGRAM_DATA_DIR);

    // Once the folder can be made, the next use starts it and /healthz is ok again.
    rmSync(path.join(engram.store.vars.ENGRAM_DATA_DIR, "chroma"));
    await engram.services.chroma.get();
    expect((await get(`${url}/healthz`)).body).toMatchObject({ status: "ok", components: { chroma: { status: "ok" } } });
  });

  it("that could not start is started again by a health check once its cause is gone, with nothing recalled", async () => {
    const { engram, url } = await start({}, { chromaStartRetryMs: 1_000 });
    const folder = path.join(engram.store.vars.ENGRAM_DATA_DIR, "chroma");
    writeFileSync(folder, "not a folder");
    await expect(engram.services.chroma.get()).rejects.toThrow();
    expect((await get(`${url}/healthz`)).body.components.chroma.status).toBe("down");
    rmSync(folder);
    // The idle instance's own health checks bring it back: no recall, no get().
    await until("/healthz to say Chroma is up on its own", async () => (await get(`${url}/healthz`)).body.components.chroma.status === "ok", 60_000);
  });
});
