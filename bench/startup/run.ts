// Start-up and CLI times of the compiled runtime, as a user meets them: `node dist/main.js`
// and `npm start` from spawn to the first GraphQL answer, on a warm folder (already created) and
// a cold one; CLI commands with the server running (they go through its store) and stopped
// (they open the folder themselves). Embedded store only: that is where start-up costs are.
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { fmt, markdownTable, measuredOn, percentile, warnIfBusy, writeReadmeSection } from "../lib.ts";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const RUNS = Number(process.env.BENCH_STARTUP_RUNS ?? 5);
const TARGET_START_MS = 3_000;
const TARGET_CLI_MS = 1_500;

const env = (dataDir: string, port: number) => {
  const clean = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("npm_")));
  return { ...clean, ENGRAM_DATA_DIR: dataDir, PORT: String(port), HOST: "127.0.0.1", ENGRAM_LOG_LEVEL: "warn", DATABASE_URL: "", OPENAI_API_KEY: "", OPENAI_BASE_URL: "" };
};

const freePort = () =>
  new Promise<number>((resolve) => {
    const server = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });

/** Spawns the server and returns the ms to the first answer of a GraphQL query with a key (or 401 without one). */
async function timeStart(command: string[], dataDir: string, key?: string) {
  const port = await freePort();
  const started = performance.now();
  const child = spawn(command[0], command.slice(1), { cwd: ROOT, env: env(dataDir, port), stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (chunk) => (out += chunk));
  let ms = NaN;
  for (;;) {
    try {
      const response = await fetch(`http://127.0.0.1:${port}/graphql`, {
        method: "POST",
        headers: { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) },
        body: JSON.stringify({ query: "{ viewer { role } }" }),
      });
      await response.text();
      ms = performance.now() - started;
      break;
    } catch {
      if (child.exitCode !== null) throw new Error(`the server exited: ${out}`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }
  // Wait for the bootstrap's key line on a first start.
  for (let i = 0; i < 200 && !key && !/ENGRAM_ADMIN_KEY=/.test(out); i++) await new Promise((r) => setTimeout(r, 25));
  const stopped = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  await stopped;
  return { ms, key: key ?? /ENGRAM_ADMIN_KEY=(\S+)/.exec(out)?.[1] };
}

function timeCli(args: string[], dataDir: string): number {
  const started = performance.now();
  const result = spawnSync(process.execPath, ["bin/engram.mjs", ...args], { cwd: ROOT, env: env(dataDir, 0), encoding: "utf8" });
  const ms = performance.now() - started;
  if (result.status !== 0 && !args.includes("--help")) throw new Error(`engram ${args.join(" ")}: ${result.stderr}`);
  return ms;
}

const stats = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  return { median: percentile(sorted, 50), max: sorted.at(-1)!, min: sorted[0] };
};

async function main() {
  warnIfBusy();
  const build = spawnSync(process.execPath, ["scripts/build.mjs"], { cwd: ROOT, encoding: "utf8" });
  if (build.status !== 0) throw new Error(build.stderr);
  const dataDir = mkdtempSync(path.join(tmpdir(), "engram-bench-startup-"));
  try {
    const cold = await timeStart([process.execPath, "dist/main.js"], dataDir);
    const key = cold.key!;
    const node: number[] = [];
    const npm: number[] = [];
    for (let i = 0; i < RUNS; i++) node.push((await timeStart([process.execPath, "dist/main.js"], dataDir, key)).ms);
    for (let i = 0; i < RUNS; i++) npm.push((await timeStart(["npm", "start", "--silent"], dataDir, key)).ms);

    const stopped: Record<string, number[]> = { "--help": [], "tenants list": [], "keys create --role reader": [] };
    for (let i = 0; i < RUNS; i++) for (const command of Object.keys(stopped)) stopped[command].push(timeCli(command.split(" "), dataDir));

    // With the server up: the commands go through its store.
    const port = await freePort();
    const server = spawn(process.execPath, ["dist/main.js"], { cwd: ROOT, env: env(dataDir, port), stdio: "ignore" });
    for (;;) {
      try {
        if ((await fetch(`http://127.0.0.1:${port}/readyz`)).ok) break;
      } catch {}
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const running: Record<string, number[]> = { "tenants list": [], "keys create --role reader": [] };
    for (let i = 0; i < RUNS; i++) for (const command of Object.keys(running)) running[command].push(timeCli(command.split(" "), dataDir));
    server.kill("SIGTERM");
    await new Promise((resolve) => server.once("exit", resolve));

    const verdict = (ms: number, target: number) => (ms <= target ? "met" : "**not met**");
    const rows: (string | number)[][] = [
      ["cold first start (new folder: creates PGlite, migrates, bootstraps)", "`node dist/main.js`", fmt(cold.ms, " ms"), "–", "–", "–"],
      ...[["`node dist/main.js`", node], ["`npm start`", npm]].map(([label, values]) => {
        const s = stats(values as number[]);
        return ["warm start to the first GraphQL answer", label as string, fmt(s.median, " ms"), fmt(s.max, " ms"), `≤ ${TARGET_START_MS} ms`, verdict(s.median, TARGET_START_MS)];
      }),
      ...Object.entries(stopped).map(([command, values]) => {
        const s = stats(values);
        return [`CLI, server stopped`, `\`engram ${command}\``, fmt(s.median, " ms"), fmt(s.max, " ms"), `≤ ${TARGET_CLI_MS} ms`, verdict(s.median, TARGET_CLI_MS)];
      }),
      ...Object.entries(running).map(([command, values]) => {
        const s = stats(values);
        return [`CLI, server running`, `\`engram ${command}\``, fmt(s.median, " ms"), fmt(s.max, " ms"), `≤ ${TARGET_CLI_MS} ms`, verdict(s.median, TARGET_CLI_MS)];
      }),
    ];
    const body = `## Start-up and CLI

Compiled runtime (esbuild bundle in \`dist/\`), embedded store, no model configured. A start is
timed from spawn to the first answer of \`{ viewer { role } }\` over HTTP with an admin key (the
PGlite child started, migrations checked, job worker started, listening); *warm* means the data
folder exists. CLI times are the whole process, spawn to exit. ${RUNS} runs each; the verdict
is on the median. Run: \`npm run bench:startup\` (\`BENCH_STARTUP_RUNS\` to change the count).

${measuredOn([])}

${markdownTable(["What", "Command", "median", "max", "target", "verdict"], rows)}
`;
    writeReadmeSection("startup", body);
    console.log(body);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
