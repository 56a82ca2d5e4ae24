import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";

/**
 * Where a test's data lives. By default an embedded store in a fresh temporary folder; with
 * ENGRAM_TEST_DATABASE_URL, a fresh database on that PostgreSQL server, dropped afterwards.
 */
export type TestStore = { vars: Record<string, string>; kind: "embedded" | "postgres"; drop(): Promise<void> };

export const serverUrl = process.env.ENGRAM_TEST_DATABASE_URL;
export const redisUrl = process.env.ENGRAM_TEST_REDIS_URL;

export async function createTestStore(): Promise<TestStore> {
  if (!serverUrl) {
    const dir = mkdtempSync(path.join(tmpdir(), "engram-test-"));
    return {
      kind: "embedded",
      vars: { ENGRAM_DATA_DIR: dir },
      drop: async () => rmSync(dir, { recursive: true, force: true }),
    };
  }
  const name = `engram_test_${randomBytes(6).toString("hex")}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  // The embedded Chroma (recall) still keeps its data under ENGRAM_DATA_DIR: one per test store.
  const dir = mkdtempSync(path.join(tmpdir(), "engram-test-"));
  return {
    kind: "postgres",
    vars: { DATABASE_URL: url.toString(), ENGRAM_DATA_DIR: dir },
    async drop() {
      rmSync(dir, { recursive: true, force: true });
      const client = new pg.Client({ connectionString: serverUrl });
      await client.connect();
      await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await client.end();
    },
  };
}
