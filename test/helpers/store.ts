import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";

/**
 * Where a test's (or a benchmark's) data lives. By default an embedded store in a fresh temporary
 * folder; with ENGRAM_TEST_DATABASE_URL, a fresh database on that PostgreSQL server, dropped afterwards.
 */
export type TestStore = { vars: Record<string, string>; kind: "embedded" | "postgres"; drop(): Promise<void> };

export const serverUrl = process.env.ENGRAM_TEST_DATABASE_URL;
export const redisUrl = process.env.ENGRAM_TEST_REDIS_URL;

export async function createTestStore(): Promise<TestStore> {
  return serverUrl ? createPostgresStore(serverUrl) : createEmbeddedStore();
}

/** An embedded store in a temporary folder (engram-<label>-…), removed by drop(). */
export function createEmbeddedStore(label = "test"): TestStore {
  const dir = mkdtempSync(path.join(tmpdir(), `engram-${label}-`));
  return {
    kind: "embedded",
    vars: { ENGRAM_DATA_DIR: dir },
    drop: async () => rmSync(dir, { recursive: true, force: true }),
  };
}

/**
 * A fresh database (engram_<label>_…) on the PostgreSQL server at `url`, dropped by drop().
 * When the server cannot be reached, onUnreachable decides what to return (default: throw).
 */
export async function createPostgresStore<U = never>(
  url: string,
  options: { label?: string; connectionTimeoutMillis?: number; onUnreachable?: (error: Error) => U } = {},
): Promise<TestStore | U> {
  const label = options.label ?? "test";
  const admin = new pg.Client({ connectionString: url, connectionTimeoutMillis: options.connectionTimeoutMillis });
  try {
    await admin.connect();
  } catch (error) {
    await admin.end().catch(() => {});
    if (!options.onUnreachable) throw error;
    return options.onUnreachable(error as Error);
  }
  const name = `engram_${label}_${randomBytes(6).toString("hex")}`;
  try {
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const database = new URL(url);
  database.pathname = `/${name}`;
  // Whatever Engram keeps on disk besides the database (the embedded Chroma for recall) goes to
  // a temporary folder of its own, never to ./.engram.
  const dir = mkdtempSync(path.join(tmpdir(), `engram-${label}-`));
  return {
    kind: "postgres",
    vars: { DATABASE_URL: database.toString(), ENGRAM_DATA_DIR: dir },
    async drop() {
      rmSync(dir, { recursive: true, force: true });
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await client.end();
    },
  };
}
