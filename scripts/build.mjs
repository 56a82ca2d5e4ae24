// Compiles the server and the CLI to dist/ with esbuild, dependencies bundled, so `npm start` and
// `bin/engram.mjs` run plain JavaScript with no TypeScript loader.
// esbuild rather than tsc: it builds the whole tree in about a second (tsc --noEmit stays the
// type check). Bundling the dependencies too makes a start load ~45 files instead of ~2,700
// modules (measured: 2.7 s of main-thread CPU to listening instead of 8.5 s on a loaded machine);
// code splitting keeps `engram --help` from loading the server's dependencies.
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { asciiOnly } from "./ascii-only.mjs";

const EXTERNAL = [
  "@prisma/*",
  "@electric-sql/*",
  "@energetic-ai/*",
  "@tensorflow/*",
  "re2js",
  "gpt-tokenizer",
  "chromadb",
  "pg",
  "pg-*",
  "@agendajs/*",
  "bufferutil",
  "utf-8-validate",
  "vite",
  "esbuild",
  "playwright-core",
];

/**
 * Prisma's query compiler reaches its client as a module holding the WASM binary in base64, which
 * the client decodes once: that module's source and the string it exports (2.5 MB each) then stay
 * in the heap for the life of the process. The module is swapped for one whose export turns into
 * the same base64 text only when the client decodes it (Buffer.from takes an object's string
 * primitive), read from the package's file then and let go after. The generated client's decode is
 * checked below, so a Prisma whose client reads the export another way fails the build, not a start.
 */
const PRISMA_COMPILER = "@prisma/client/runtime/query_compiler_bg.postgresql.wasm-base64.mjs";
const prismaCompilerFromFile = {
  name: "prisma-compiler-from-file",
  setup(build) {
    build.onResolve({ filter: /^@prisma\/client\/runtime\/query_compiler_bg\.postgresql\.wasm-base64\.mjs$/ }, (args) => {
      const importer = readFileSync(args.importer, "utf8");
      if (!importer.includes("Buffer.from(wasmBase64, 'base64')")) {
        throw new Error(`${args.importer} no longer decodes Prisma's compiler with Buffer.from(wasmBase64, 'base64'): see prismaCompilerFromFile in scripts/build.mjs`);
      }
      return { path: PRISMA_COMPILER, namespace: "prisma-compiler-from-file" };
    });
    build.onLoad({ filter: /.*/, namespace: "prisma-compiler-from-file" }, () => ({
      loader: "js",
      contents: `import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
export const wasm = {
  [Symbol.toPrimitive]() {
    const text = readFileSync(createRequire(import.meta.url).resolve(${JSON.stringify(PRISMA_COMPILER)}), "latin1");
    return text.slice(text.indexOf('"') + 1, text.lastIndexOf('"'));
  },
};
`,
    }));
  },
};

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const dist = path.join(root, "dist");
const staging = path.join(root, `.dist-${process.pid}`);
const lock = path.join(root, ".dist-lock");

// One build at a time (tests may ask for it in parallel); a lock older than a minute is stale.
for (let waited = 0; ; waited += 100) {
  try {
    mkdirSync(lock);
    break;
  } catch (error) {
    if (error.code !== "EEXIST") throw error;
    try {
      if (Date.now() - statSync(lock).mtimeMs > 60_000) rmSync(lock, { recursive: true, force: true });
    } catch {}
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
try {
  const started = Date.now();
  await build({
    absWorkingDir: root,
    entryPoints: { main: "bin/server.ts", cli: "src/cli.ts" },
    outdir: staging,
    bundle: true,
    splitting: true,
    format: "esm",
    platform: "node",
    target: "node20",
    // Left outside: packages that load files next to themselves at run time (Prisma's WASM
    // engine, PGlite's WASM and data, the encoder's weights, re2js by path for its worker,
    // Chroma), pg (its protocol writer breaks when bundled), the tokenizer (required on its first
    // count, see src/memory/tokens.ts), optional native add-ons, dev tools.
    external: EXTERNAL,
    // Bundled CommonJS packages call require(); an ESM bundle gets one from its own URL.
    banner: { js: "import { createRequire as __engramCreateRequire } from 'node:module'; const require = __engramCreateRequire(import.meta.url);" },
    sourcemap: true,
    // Non-ASCII characters escaped where esbuild can (strings, identifiers); the rest in scripts/ascii-only.mjs.
    charset: "ascii",
    chunkNames: "chunks/[name]-[hash]",
    plugins: [prismaCompilerFromFile],
    logLevel: "warning",
  });
  for (const file of readdirSync(staging, { recursive: true })) {
    if (!file.endsWith(".js")) continue;
    const kept = asciiOnly(path.join(staging, file));
    if (kept) process.stderr.write(`build: ${file}:${kept.line} keeps a non-ASCII character (in a template literal?), so Node holds this file's source at two bytes a character\n`);
  }
  // Swap the folder whole, so nothing ever runs a half-written build.
  const old = `${dist}.old-${process.pid}`;
  try {
    renameSync(dist, old);
  } catch (error) {
    if (error.code !== "ENOENT") throw error;
  }
  renameSync(staging, dist);
  rmSync(old, { recursive: true, force: true });
  process.stdout.write(`built dist/ in ${Date.now() - started} ms\n`);
} catch (error) {
  rmSync(staging, { recursive: true, force: true });
  process.stderr.write(`${error?.message ?? error}\n`);
  process.exitCode = 1;
} finally {
  rmSync(lock, { recursive: true, force: true });
}
