// Creates a new embedded database folder, in a short-lived process of its own (what creating
// leaves in PostgreSQL's WASM heap would otherwise stay resident in the process that serves it).
//
//   node --liftoff-only pglite-init.mjs <folder> [template]
//       creates <folder>: unpacks the template (a tarball of a new database folder, made once at
//       install) or, when there is none or it cannot be read, runs initdb. The folder appears
//       whole or not at all: it is built beside it and renamed into place.
//   node pglite-init.mjs --template [template]
//       makes the template (run by `npm ci`'s postinstall; nothing to do when it exists).
//
// Why a template: initdb inside PGlite peaked at 691 MB resident and took 5.0 s here; unpacking
// the same folder from a tarball, 288 MB and 1.7 s (bench/README.md, "Start-up and CLI"). A
// tarball is tied to the PGlite version that made it, so its name carries that version.
// Plain JS so it runs the same under node, tsx and vitest.
import { existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, rmdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { PGlite } from "@electric-sql/pglite";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");

// PostgreSQL's default 128 MB of shared buffers stays resident in the WASM heap once touched.
// 32 MB, on a copy of a LoCoMo-sized store (127 MB on disk) over 1,500 recall searches: 251 MB
// resident instead of 370, p50 9.95 ms instead of 9.37, p95 the same (bench/README.md, "Memory
// footprint"). The pages it no longer keeps stay in the operating system's file cache. Creating a
// folder takes the same buffers (initdb peaked at 887 MB resident with the default, 795 without).
export const START_PARAMS = ["-c", "shared_buffers=32MB"];

/** The template's default place: npm's cache folder for tools, named by PGlite's version. */
export function defaultTemplate() {
  const entry = fileURLToPath(import.meta.resolve("@electric-sql/pglite"));
  let dir = path.dirname(entry);
  while (!existsSync(path.join(dir, "package.json"))) dir = path.dirname(dir);
  const { version } = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8"));
  return path.join(ROOT, "node_modules", ".cache", "engram", `pglite-${version}-datadir.tar.gz`);
}

/** Builds a new database in a folder beside `folder` and returns that folder's path. */
async function build(folder, template) {
  const staging = `${folder}.new-${process.pid}`;
  rmSync(staging, { recursive: true, force: true });
  const options = { startParams: [...PGlite.defaultStartParams, ...START_PARAMS] };
  if (template && existsSync(template)) {
    try {
      const db = await PGlite.create(staging, { ...options, loadDataDir: new Blob([readFileSync(template)]) });
      await db.close();
      return { staging, from: "template" };
    } catch (error) {
      process.stderr.write(`engram: the database template ${template} could not be unpacked (${error?.message ?? error}); running initdb instead\n`);
      rmSync(staging, { recursive: true, force: true });
    }
  }
  const db = await PGlite.create(staging, options);
  await db.close();
  return { staging, from: "initdb" };
}

/** Creates `folder` as a new database, whole or not at all. Prints how ("template" or "initdb"). */
async function create(folder, template) {
  // One owner of the data folder at a time (src/embedded/embedded.ts), so a staging folder found
  // here was left by a creation that did not finish.
  const parent = path.dirname(folder);
  mkdirSync(parent, { recursive: true });
  for (const name of readdirSync(parent)) {
    if (name.startsWith(`${path.basename(folder)}.new-`)) rmSync(path.join(parent, name), { recursive: true, force: true });
  }
  if (existsSync(folder) && readdirSync(folder).length > 0) {
    throw new Error(`${folder} holds files but no database (no PG_VERSION); move it away and start again`);
  }
  const { staging, from } = await build(folder, template);
  if (existsSync(folder)) rmdirSync(folder);
  renameSync(staging, folder);
  process.stdout.write(`${from}\n`);
}

async function makeTemplate(template) {
  if (existsSync(template)) return;
  mkdirSync(path.dirname(template), { recursive: true });
  // Templates of other PGlite versions (an upgrade) are of no use any more.
  for (const name of readdirSync(path.dirname(template))) {
    if (/^pglite-.+-datadir\.tar\.gz$/.test(name)) rmSync(path.join(path.dirname(template), name), { force: true });
  }
  const staging = `${template}.new-${process.pid}`;
  rmSync(staging, { recursive: true, force: true });
  try {
    const db = await PGlite.create(staging, { startParams: [...PGlite.defaultStartParams, ...START_PARAMS] });
    const tarball = await db.dumpDataDir("gzip");
    await db.close();
    writeFileSync(`${staging}.tar.gz`, Buffer.from(await tarball.arrayBuffer()));
    renameSync(`${staging}.tar.gz`, template);
  } finally {
    rmSync(staging, { recursive: true, force: true });
    rmSync(`${staging}.tar.gz`, { force: true });
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const [first, second] = process.argv.slice(2);
  if (first === "--template") await makeTemplate(second ?? defaultTemplate());
  else if (first) await create(path.resolve(first), second ?? defaultTemplate());
  else throw new Error("usage: pglite-init.mjs <folder> [template] | --template [template]");
}
