import { existsSync } from "node:fs";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { attachOrStartEmbeddedStore } from "../../src/embedded/embedded.ts";
import { modelEnv } from "../helpers/engram.ts";
import { scriptFaultyModel } from "../helpers/faulty-model.ts";
import { startModelServer, type ModelServer } from "../helpers/model-server.ts";
import {
  adminKeyOf,
  ensureCompiled,
  freePort,
  killAll,
  processTree,
  startServer,
  waitAllGone,
  type ServerProcess,
} from "../helpers/server-process.ts";
import { createTestStore, type TestStore } from "../helpers/store.ts";
import { until } from "../helpers/until.ts";
import { startWriteLoad, untilFollowUpsDone, verifyAcknowledged } from "../helpers/write-load.ts";

// kill -9 of the compiled server while agents write: its children (PGlite, Chroma) exit on their
// own, the next start on the same folder and port takes over, no acknowledged write is lost or
// doubled (clients retry with the same ids), and the turns caught mid-flight get their follow-ups.
vi.setConfig({ testTimeout: 300_000, hookTimeout: 300_000 });

let model: ModelServer;
let store: TestStore;
const started: ServerProcess[] = [];
const trees: number[][] = [];

beforeAll(async () => {
  ensureCompiled();
  model = await startModelServer();
  scriptFaultyModel(model);
  store = await createTestStore();
});
afterAll(async () => {
  for (const [i, server] of started.entries()) killAll(trees[i] ?? [server.child.pid!], server.dataDir);
  await model?.stop();
  await store?.drop();
});

async function start(port: number) {
  const server = await startServer({
    via: "node",
    dataDir: store.vars.ENGRAM_DATA_DIR,
    // On PostgreSQL the dead server's job locks lapse after ENGRAM_JOB_LOCK_MS: short here, so
    // the test sees them taken over (the embedded store frees them at the next start).
    env: { ...store.vars, ...modelEnv(model), ENGRAM_EMBEDDINGS: "openai", ENGRAM_JOB_LOCK_MS: "60000", PORT: String(port) },
  });
  started.push(server);
  return server;
}

/** The store's connection string as the test reads it: the running server's PGlite, or PostgreSQL. */
async function storeUrl() {
  if (store.vars.DATABASE_URL) return store.vars.DATABASE_URL;
  return (await attachOrStartEmbeddedStore(store.vars.ENGRAM_DATA_DIR)).url;
}

/**
 * The first server, on a port free a moment before: test files run in parallel, and another one's
 * server may take the port in between (seen in CI: EADDRINUSE), so a start that finds it taken
 * tries another. The restart reuses the port the first one had.
 */
async function startOnAFreePort() {
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    try {
      return { port, first: await start(port) };
    } catch (error) {
      if (attempt >= 3 || !/already in use/.test(String(error))) throw error;
    }
  }
}

describe("kill -9 of the server under write load", () => {
  it("loses no acknowledged write, doubles none, and every turn gets its follow-ups after the restart", async () => {
    const { port, first } = await startOnAFreePort();
    const key = await adminKeyOf(first);
    const viewer = await fetch(`${first.url}/graphql`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ query: "{ viewer { tenant { id } } }" }),
    });
    const tenantId = ((await viewer.json()) as any).data.viewer.tenant.id as string;

    // Retries span the restart: a write that failed mid-crash is tried again with its id.
    const load = startWriteLoad({ url: first.url, key, clients: 8, conversations: 8, tag: "kill", retries: 40 });
    try {
      await load.untilAcked(40);
      if (store.kind === "embedded") await until("the embedded Chroma", async () => existsSync(path.join(store.vars.ENGRAM_DATA_DIR, "chroma.owner.json")), 60_000);
      trees.push(processTree(first.child.pid!));
      process.kill(first.child.pid!, "SIGKILL");
      await waitAllGone(trees[0], first.dataDir);
      const ackedAtKill = load.acked.turns.length + load.acked.events.length;

      const second = await start(port);
      await load.untilAcked(ackedAtKill + 40).catch((error) => {
        throw new Error(`${error.message}: ${JSON.stringify(load.stats, (k, v) => (k === "latencies" ? v.length : v))}\n${second.output().slice(-3000)}`);
      });
      await load.stop();
      trees.push(processTree(second.child.pid!));
      expect(second.output()).not.toMatch(/ENGRAM_ADMIN_KEY/); // the same tenant, not a new first start

      const url = await storeUrl();
      expect(await verifyAcknowledged(url, tenantId, load.acked)).toEqual([]);
      // Failed attempts while the server was down were retried, and the retries were acknowledged.
      expect(load.stats.recordTurn.errors + load.stats.appendEvent.errors).toBeGreaterThan(0);
      await untilFollowUpsDone(url, tenantId, 200_000);
      const health = (await (await fetch(`${second.url}/healthz`)).json()) as { status: string };
      expect(health.status).toBe("ok");
    } finally {
      await load.stop();
    }
  });
});
