import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it, vi } from "vitest";
import { startEmbeddedStore, type Store } from "../src/embedded/embedded.ts";
import { createLogger } from "../src/log.ts";
import { processTree } from "./helpers/server-process.ts";
import { until } from "./helpers/until.ts";

// Processes start slowly on a loaded machine: generous limits (behaviour, not speed, is tested).
vi.setConfig({ testTimeout: 300_000, hookTimeout: 300_000 });

// The embedded store must never wedge: a session pinned by a transaction is released when its
// client errors, leaves or sits idle while others wait; a PGlite child that dies is restarted on
// the same port; and a full disk gives errors, never a hang, and recovers once space is freed.

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await Promise.resolve(cleanup()).catch(() => {});
});

const log = createLogger(process.env.ENGRAM_TEST_LOG_LEVEL === "debug" ? "debug" : "silent");

async function store(options: { dir?: string; idleTxMs?: number } = {}): Promise<Store> {
  const dir = options.dir ?? mkdtempSync(path.join(tmpdir(), "engram-wedge-"));
  if (!options.dir) cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  const running = await startEmbeddedStore(dir, { log, idleTxMs: options.idleTxMs });
  cleanups.push(() => running.stop());
  return running;
}

async function client(url: string) {
  const c = new pg.Client({ connectionString: url });
  c.on("error", () => {}); // a connection the store cuts off
  await c.connect();
  cleanups.push(() => c.end().catch(() => {}));
  return c;
}

const count = async (url: string, table: string) => {
  const c = await client(url);
  const { rows } = await c.query(`SELECT count(*)::int AS n FROM ${table}`);
  await c.end();
  return rows[0].n as number;
};

/** The PGlite child serving this store (a child of this process naming the folder). */
function pgliteChild(dir: string): number | undefined {
  const pid = processTree(process.pid).find((p) => {
    try {
      const cmd = readFileSync(`/proc/${p}/cmdline`, "utf8");
      return cmd.includes("pglite-child") && cmd.includes(dir);
    } catch {
      return false;
    }
  });
  return pid;
}

describe("a pinned session is always released", () => {
  it("a client idle in its transaction while others wait is cut off and rolled back", async () => {
    const s = await store({ idleTxMs: 500 });
    const setup = await client(s.url);
    await setup.query("CREATE TABLE t (v int)");
    const stuck = await client(s.url);
    await stuck.query("BEGIN");
    await stuck.query("INSERT INTO t VALUES (1)");
    // stuck now sends nothing more, as a client whose process hangs would.
    expect(await count(s.url, "t")).toBe(0);
    await expect(stuck.query("COMMIT")).rejects.toThrow();
    expect(await count(s.url, "t")).toBe(0);
  });

  it("a client that leaves mid-transaction, after an error, is rolled back", async () => {
    const s = await store();
    const setup = await client(s.url);
    await setup.query("CREATE TABLE t (v int PRIMARY KEY)");
    const leaving = await client(s.url);
    await leaving.query("BEGIN");
    await leaving.query("INSERT INTO t VALUES (1)");
    await expect(leaving.query("INSERT INTO t VALUES (1)")).rejects.toThrow(/duplicate/);
    (leaving as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy();
    expect(await count(s.url, "t")).toBe(0);
    await setup.query("INSERT INTO t VALUES (2)");
    expect(await count(s.url, "t")).toBe(1);
  });
});

describe("the PGlite child is supervised", () => {
  it("killed with SIGKILL, it is restarted on the same port and keeps its data", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "engram-wedge-"));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const s = await store({ dir });
    const setup = await client(s.url);
    await setup.query("CREATE TABLE t (v int)");
    await setup.query("INSERT INTO t VALUES (1)");
    const before = pgliteChild(dir)!;
    expect(before).toBeDefined();
    process.kill(before, "SIGKILL");
    await until("the store to be back", async () => {
      const now = pgliteChild(dir);
      return s.state() === "up" && now !== undefined && now !== before;
    }, 60_000);
    expect(await count(s.url, "t")).toBe(1);
  });
});

// A real full disk: a small tmpfs (needs root and mount; skipped loudly otherwise).
const mountable = (() => {
  if (process.getuid?.() !== 0) return false;
  const probe = mkdtempSync(path.join(tmpdir(), "engram-mount-probe-"));
  const ok = spawnSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", probe]).status === 0;
  if (ok) spawnSync("umount", [probe]);
  rmSync(probe, { recursive: true, force: true });
  return ok;
})();
if (!mountable) console.warn("store-wedge: cannot mount a tmpfs here (needs root): the disk-full test is skipped");

describe.skipIf(!mountable)("a full disk", () => {
  it("answers errors, never hangs, and recovers once space is freed", async () => {
    const mountPoint = mkdtempSync(path.join(tmpdir(), "engram-full-"));
    expect(spawnSync("mount", ["-t", "tmpfs", "-o", "size=96m", "tmpfs", mountPoint]).status).toBe(0);
    cleanups.push(() => {
      spawnSync("umount", ["-l", mountPoint]);
      rmSync(mountPoint, { recursive: true, force: true });
    });
    const dir = path.join(mountPoint, "data");
    mkdirSync(dir);
    const s = await store({ dir, idleTxMs: 2_000 });
    const writer = await client(s.url);
    await writer.query("CREATE TABLE t (v text)");
    await writer.query("INSERT INTO t VALUES ('kept')");
    // Fill the rest of the disk, leaving a file we can delete later.
    const reserve = path.join(mountPoint, "reserve");
    writeFileSync(reserve, Buffer.alloc(8 * 1024 * 1024));
    let failed: Error | undefined;
    const big = randomBytes(192 * 1024).toString("base64"); // incompressible, so TOAST cannot shrink it
    for (let i = 0; i < 400 && !failed; i++) {
      try {
        await writer.query("BEGIN");
        for (let row = 0; row < 8; row++) await writer.query("INSERT INTO t VALUES ($1)", [`${row}${big}`]);
        await writer.query("COMMIT");
      } catch (error) {
        failed = error as Error;
        await writer.query("ROLLBACK").catch(() => {});
      }
    }
    expect(failed, "the disk never filled").toBeDefined();
    // Space freed: the store answers again (restarted if PGlite gave up), with the committed row.
    rmSync(reserve);
    const kept = await until(
      "the store to answer after space was freed",
      async () => {
        try {
          const c = new pg.Client({ connectionString: s.url, connectionTimeoutMillis: 5_000, query_timeout: 10_000 } as pg.ClientConfig);
          c.on("error", () => {});
          await c.connect();
          const { rows } = await c.query("SELECT count(*)::int AS n FROM t WHERE v = 'kept'");
          await c.end();
          return rows[0].n === 1; // the row committed before the disk filled is still there
        } catch {
          return false;
        }
      },
      90_000,
    );
    expect(kept).toBe(true);
    // And it still stops, promptly.
    await s.stop();
  }, 240_000);
});
