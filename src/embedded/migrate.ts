import { createHash } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { fromRoot } from "../paths.ts";
import pg from "pg";

const migrationsDir = fromRoot("prisma", "migrations");
// Any constant works: it only keeps two instances starting together from migrating at once.
const MIGRATION_LOCK = 727_361_001;

export type Migration = { name: string; sql: string; checksum: string };

export function committedMigrations(dir = migrationsDir): Migration[] {
  return readdirSync(dir, { withFileTypes: true })
    .filter((entry) => entry.isDirectory())
    .map((entry) => entry.name)
    .sort()
    .map((name) => {
      const sql = readFileSync(`${dir}/${name}/migration.sql`, "utf8");
      return { name, sql, checksum: createHash("sha256").update(sql).digest("hex") };
    });
}

/**
 * Applies the committed migration.sql files that the store has not seen, each in its own
 * transaction, and returns their names. The same code runs on PGlite and PostgreSQL.
 */
export async function migrate(url: string, migrations = committedMigrations()): Promise<string[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query("SELECT pg_advisory_lock($1)", [MIGRATION_LOCK]);
    await client.query(`CREATE TABLE IF NOT EXISTS "_engram_migrations" (
      name text PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`);
    const { rows } = await client.query<{ name: string; checksum: string }>(
      `SELECT name, checksum FROM "_engram_migrations"`,
    );
    const applied = new Map(rows.map((row) => [row.name, row.checksum]));
    const done: string[] = [];
    for (const migration of migrations) {
      const checksum = applied.get(migration.name);
      if (checksum === migration.checksum) continue;
      if (checksum) {
        throw new Error(
          `Migration ${migration.name} was changed after it was applied; add a new migration instead.`,
        );
      }
      await client.query("BEGIN");
      try {
        await client.query(migration.sql);
        await client.query(`INSERT INTO "_engram_migrations" (name, checksum) VALUES ($1, $2)`, [
          migration.name,
          migration.checksum,
        ]);
        await client.query("COMMIT");
      } catch (error) {
        await client.query("ROLLBACK");
        throw new Error(`Migration ${migration.name} failed: ${(error as Error).message}`);
      }
      done.push(migration.name);
    }
    return done;
  } finally {
    await client.query("SELECT pg_advisory_unlock($1)", [MIGRATION_LOCK]).catch(() => {});
    await client.end();
  }
}
