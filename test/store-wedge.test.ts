import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it, vi } from "vitest";
import { startEmbeddedStore, type Store } from "../src/embedded/embedded.ts";
import { createLogger } from "../src/log.ts";

// Processes start slowly on a loaded machine: generous limits (behaviour, not speed, is tested).
vi.setConfig({ testTimeout: 300_000, hookTimeout: 300_000 });

// The embedded store must never wedge: a session pinned by a transaction is released when its
// client errors, leaves or sits idle while others wait.

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

// The PGlite child killed (restarted on the same port with its data) and a full disk (a real
// tmpfs) are tested under write load in test/faults/store-kill.test.ts and disk-full.test.ts.
