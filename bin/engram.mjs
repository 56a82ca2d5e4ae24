#!/usr/bin/env node
// Engram's CLI: runs the compiled code in dist/ (built by `npm ci` / `npm run build`).
import { existsSync } from "node:fs";

const cli = new URL("../dist/cli.js", import.meta.url);
if (!existsSync(cli)) {
  process.stderr.write("Engram is not built: run `npm run build` (npm ci does it).\n");
  process.exit(1);
}
await import(cli.href);
