#!/usr/bin/env node
// Engram's CLI: runs the compiled code in dist/ (built by `npm ci` / `npm run build`).
// `engram start` runs the server's entry, dist/main.js, in this process (`npm start` runs it with
// V8's memory flags and two malloc arenas, README "Under a supervisor"; here only the embedded
// store's children get the arenas, unless MALLOC_ARENA_MAX is set); the rest is dist/cli.js.
import { existsSync } from "node:fs";

const entry = new URL(process.argv[2] === "start" ? "../dist/main.js" : "../dist/cli.js", import.meta.url);
if (!existsSync(entry)) {
  process.stderr.write("Engram is not built: run `npm run postinstall` (npm ci runs it, unless --ignore-scripts).\n");
  process.exit(1);
}
await import(entry.href);
