// Creates a new embedded database folder, in a short-lived process of its own (what creating
// leaves in PostgreSQL's WASM heap would otherwise stay resident in the process that serves it).
//
//   node --liftoff-only pglite-init.mjs <folder> [template]
//       creates <folder>: unpacks the template (a tarball of a new database folder, made once at
//       install) or, when there is none or it cannot be read, runs initdb. The folder appears
//       whole or not at all: it is built beside it and renamed into place. Prints "template" or
//       "initdb".
//   node pglite-init.mjs --template [template]
//       makes the template if it is missing (`npm ci`'s postinstall). A failure is only said:
//       without a template, new folders are made by initdb.
//
// Why a template: initdb inside PGlite peaked at 691 MB resident and took 5.0 s here; unpacking
// the same folder from a tarball, 288 MB and 1.8 s (bench/README.md, "Start-up and CLI"). A
// tarball is tied to the PGlite version that made it, so its name carries that version.
// Plain JS so it runs the same under node, tsx and vitest.
import { existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, rmdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { PGlite } from "@electric-sql/pglite";
import { START_OPTIONS } from "./pglite-params.mjs";

/**
 * The template's default place: npm's cache folder for tools, named by PGlite's version. (The
 * package roots are found as src/paths.ts finds Engram's, which plain JS cannot import.)
 */
function defaultTemplate() {
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
  let dir = path.dirname(fileURLToPath(import.meta.resolve("@electric-sql/pglite")));
  while (!existsSync(path.join(dir, "package.json"))) {
    if (path.dirname(dir) === dir) throw new Error("@electric-sql/pglite has no package.json above it");
    dir = path.dirname(dir);
  }
  const { version } = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8"));
  return path.join(root, "node_modules", ".cache", "engram", `pglite-${version}-datadir.tar.gz`);
}

// owner.ts's isAlive, which this plain-JS child process cannot import.
function isAlive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return error.code === "EPERM";
  }
}

/** Removes what a process that died while making `target` left beside it (`<target>.new-<pid>…`). */
function clearLeftovers(target) {
  const parent = path.dirname(target);
  const prefix = `${path.basename(target)}.new-`;
  for (const name of readdirSync(parent)) {
    const pid = Number.parseInt(name.slice(prefix.length), 10);
    if (name.startsWith(prefix) && pid !== process.pid && !isAlive(pid)) rmSync(path.join(parent, name), { recursive: true, force: true });
  }
}

/** PGlite's file system errors carry WASI's errno and no message: the ones an operator can act on, by name. */
const WASI_ERRNO = { 2: "permission denied (EACCES)", 19: "disk quota exceeded (EDQUOT)", 51: "no space left on device (ENOSPC)", 63: "operation not permitted (EPERM)", 69: "read-only file system (EROFS)" };

/** An error in words: its message, or what PGlite's errno means. */
function describe(error) {
  if (error?.message) return error.message;
  if (error?.name === "ErrnoError") return WASI_ERRNO[error.errno] ?? `file system error (WASI errno ${error.errno})`;
  return String(error);
}

/** Builds a new database in a folder beside `folder`; returns that folder and how it was made. */
async function build(folder, template) {
  const staging = `${folder}.new-${process.pid}`;
  rmSync(staging, { recursive: true, force: true });
  if (existsSync(template)) {
    try {
      const db = await PGlite.create(staging, { ...START_OPTIONS, loadDataDir: new Blob([readFileSync(template)]) });
      await db.close();
      return { staging, from: "template" };
    } catch (error) {
      process.stderr.write(`engram: the database template ${template} could not be unpacked (${describe(error)}); running initdb instead\n`);
      rmSync(staging, { recursive: true, force: true });
    }
  } else {
    process.stderr.write(`engram: no database template at ${template} (npm run pglite:template makes it); running initdb\n`);
  }
  try {
    const db = await PGlite.create(staging, START_OPTIONS);
    await db.close();
  } catch (error) {
    // What was written so far goes: on a full disk it is what fills it.
    rmSync(staging, { recursive: true, force: true });
    process.stderr.write(`engram: creating the embedded database in ${folder} failed: ${describe(error)}\n`);
    process.exit(1);
  }
  return { staging, from: "initdb" };
}

async function create(folder, template) {
  if (existsSync(path.join(folder, "PG_VERSION"))) throw new Error(`${folder} already holds a database`);
  if (existsSync(folder) && readdirSync(folder).length > 0) {
    throw new Error(`${folder} holds files but no database (no PG_VERSION); move it away and start again`);
  }
  mkdirSync(path.dirname(folder), { recursive: true });
  clearLeftovers(folder);
  const { staging, from } = await build(folder, template);
  if (existsSync(folder)) rmdirSync(folder);
  renameSync(staging, folder);
  process.stdout.write(`${from}\n`);
}

async function makeTemplate(template) {
  if (existsSync(template)) return;
  const dir = path.dirname(template);
  mkdirSync(dir, { recursive: true });
  clearLeftovers(template);
  // Templates of other PGlite versions (an upgrade) are of no use any more.
  for (const name of readdirSync(dir)) {
    if (/^pglite-.+-datadir\.tar\.gz$/.test(name)) rmSync(path.join(dir, name), { force: true });
  }
  const staging = `${template}.new-${process.pid}`;
  try {
    const db = await PGlite.create(staging, START_OPTIONS);
    const tarball = await db.dumpDataDir("gzip");
    await db.close();
    writeFileSync(`${staging}.tar.gz`, Buffer.from(await tarball.arrayBuffer()));
    renameSync(`${staging}.tar.gz`, template);
  } catch (error) {
    process.stderr.write(`engram: could not make the database template ${template} (${describe(error)}); new data folders will be made by initdb\n`);
  } finally {
    rmSync(staging, { recursive: true, force: true });
    rmSync(`${staging}.tar.gz`, { force: true });
  }
}

const [first, second] = process.argv.slice(2);
if (first === "--template") await makeTemplate(path.resolve(second ?? defaultTemplate()));
else if (first) await create(path.resolve(first), path.resolve(second ?? defaultTemplate()));
else throw new Error("usage: pglite-init.mjs <folder> [template] | --template [template]");
