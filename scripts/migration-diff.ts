// Authors the next migration offline. Each migration folder keeps the schema.prisma it was made
// from; the new migration is the diff from the latest of those to prisma/schema.prisma. The WASM
// schema engine insists on a database to talk to, so a throwaway in-memory PGlite serves it.
// Writes prisma/migrations/<NNNN_name>/{migration.sql,schema.prisma}.
//   npm run migration:new -- add_something
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { copyFileSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { PGlite } from "@electric-sql/pglite";
import { PGLiteSocketServer } from "@electric-sql/pglite-socket";

const name = process.argv[2]?.replace(/[^a-z0-9_]/gi, "_");
if (!name) {
  console.error("usage: npm run migration:new -- <name>");
  process.exit(2);
}
const root = path.resolve(import.meta.dirname, "..");
const migrationsDir = path.join(root, "prisma", "migrations");

const latest = readdirSync(migrationsDir).sort().at(-1);
if (!latest) throw new Error("No committed migration to diff from.");
const db = await PGlite.create();
const server = new PGLiteSocketServer({ db, port: 0, maxConnections: 4 });
await server.start();
const url = `postgres://postgres@${server.getServerConn()}/postgres?sslmode=disable`;

// Asynchronous on purpose: the scratch database answers from this process's event loop.
const diff = await promisify(execFile)(
  "prisma",
  [
    "migrate",
    "diff",
    "--from-schema-datamodel",
    path.join(migrationsDir, latest, "schema.prisma"),
    "--to-schema-datamodel",
    "prisma/schema.prisma",
    "--script",
  ],
  {
    cwd: root,
    env: {
      ...process.env,
      DATABASE_URL: url,
      PATH: `${path.join(root, "node_modules", ".bin")}${path.delimiter}${process.env.PATH}`,
      PRISMA_QUERY_ENGINE_LIBRARY: path.join(root, "package.json"),
    },
  },
).catch((error: { stderr?: string; code?: number }) => {
  console.error(error.stderr ?? error);
  process.exit(typeof error.code === "number" ? error.code : 1);
});
await server.stop();
await db.close();
const sql = String(diff.stdout).trim();
if (!sql || /^-- This is an empty migration/.test(sql)) {
  console.log("The schema matches the committed migrations: nothing to write.");
  process.exit(0);
}
const next = String(readdirSync(migrationsDir).length + 1).padStart(4, "0");
const dir = path.join(migrationsDir, `${next}_${name}`);
mkdirSync(dir);
writeFileSync(path.join(dir, "migration.sql"), `${sql}\n`);
copyFileSync(path.join(root, "prisma", "schema.prisma"), path.join(dir, "schema.prisma"));
console.log(`Wrote ${path.relative(root, dir)}/migration.sql: review it (tsvector columns and indexes are hand-written), then commit it.`);
