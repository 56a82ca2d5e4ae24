#!/usr/bin/env node
// Engram's CLI: runs the TypeScript sources through tsx, as `npm start` does.
import { register } from "tsx/esm/api";

register();
await import("../src/cli.ts");
