import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, statSync } from "node:fs";
import net, { type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { newestCompiledSource, ROOT } from "../../src/paths.ts";
import { until } from "./until.ts";

// Engram as a user runs it: the compiled server (`npm start` or `node dist/main.js`) or the CLI
// in their own process group, on a free port and a fresh data folder.
export { ROOT };

/** Compiles dist/ when it is missing or older than the sources (the build itself is ~1 s). */
export function ensureCompiled() {
  const main = path.join(ROOT, "dist", "main.js");
  if (existsSync(main) && statSync(main).mtimeMs >= newestCompiledSource()) return;
  const result = spawnSync(process.execPath, [path.join(ROOT, "scripts", "build.mjs")], { cwd: ROOT, encoding: "utf8" });
  if (result.status !== 0) throw new Error(`npm run build:server failed: ${result.stderr}`);
}

/** A loopback port free right now, for a server that must come back on the same port. */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

export const tempDataDir = (name = "engram-proc-") => mkdtempSync(path.join(tmpdir(), name));

export type ServerProcess = {
  child: ChildProcess;
  /** The process group (the spawned process leads it). */
  pgid: number;
  dataDir: string;
  url: string;
  /** Everything written on stdout and stderr so far. */
  output(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Waits until stdout and stderr are closed, so that output() holds everything (see closeWatch). */
  drained(timeoutMs?: number): Promise<void>;
};

/**
 * Watches for the child's stdout and stderr to close (its 'close' event, which comes once every
 * holder of the pipes has exited and their last bytes have been read); call it right after
 * spawning, and the function it returns when the output must be complete. A process tree can be
 * gone from /proc before its parent has read what it wrote last ("store closed; bye").
 */
export function closeWatch(child: ChildProcess): (timeoutMs?: number) => Promise<void> {
  let closed = false;
  child.once("close", () => (closed = true));
  return async (timeoutMs = 30_000) => {
    await until("the child's stdout and stderr to close", async () => closed || undefined, timeoutMs);
  };
}

/** Clean environment: npm's variables from the test runner's own npm would confuse the server. */
export function baseEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("npm_") && !key.startsWith("VITEST") && key !== "NODE_OPTIONS"));
  return {
    ...env,
    HOST: "127.0.0.1",
    PORT: "0",
    ENGRAM_LOG_LEVEL: "info",
    ENGRAM_JOB_POLL_MS: "200",
    OPENAI_API_KEY: "",
    OPENAI_BASE_URL: "",
    DATABASE_URL: "",
    REDIS_URL: "",
    CHROMA_URL: "",
    ...extra,
  };
}

/** Starts `npm start` or `node dist/main.js` and waits for it to listen. */
export async function startServer(
  options: { via: "npm" | "node"; dataDir?: string; env?: Record<string, string>; timeoutMs?: number },
): Promise<ServerProcess> {
  const dataDir = options.dataDir ?? tempDataDir();
  const [command, args] = options.via === "npm" ? ["npm", ["start", "--silent"]] : [process.execPath, ["dist/main.js"]];
  const child = spawn(command, args, {
    cwd: ROOT,
    detached: true, // its own process group, as under a supervisor
    stdio: ["ignore", "pipe", "pipe"],
    env: baseEnv({ ENGRAM_DATA_DIR: dataDir, ...options.env }),
  });
  const drained = closeWatch(child);
  let output = "";
  child.stdout!.on("data", (chunk) => (output += chunk));
  child.stderr!.on("data", (chunk) => (output += chunk));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal })),
  );
  let gone = false;
  void exited.then(() => (gone = true));
  const url = await until(
    "the server to listen",
    async () => {
      if (gone) throw new Error(`the server exited before listening:\n${output}`);
      return /listening on (http:\/\/[^\s]+)\/graphql/.exec(output)?.[1];
    },
    options.timeoutMs ?? 240_000,
  );
  return { child, pgid: child.pid!, dataDir, url, output: () => output, exited, drained };
}

/** The admin key a first start prints (once, right after it listens). */
export function adminKeyOf(server: ServerProcess): Promise<string> {
  return until("the admin key to be printed", async () => /ENGRAM_ADMIN_KEY=(\S+)/.exec(server.output())?.[1], 30_000);
}

/** Pids of every process whose parent chain leads to pid (pid included), from /proc. */
export function processTree(pid: number): number[] {
  const parents = new Map<number, number>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      parents.set(Number(entry), ppid);
    } catch {}
  }
  const tree = [pid];
  for (let i = 0; i < tree.length; i++) for (const [child, parent] of parents) if (parent === tree[i]) tree.push(child);
  return tree;
}

/** Live, non-zombie processes among pids, plus any process whose command line names dataDir. */
export function survivors(pids: number[], dataDir: string): number[] {
  const alive = new Set<number>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      if (stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z")) continue;
      if (pids.includes(pid) || readFileSync(`/proc/${entry}/cmdline`, "utf8").includes(dataDir)) alive.add(pid);
    } catch {}
  }
  return [...alive];
}

/** Waits until none of pids (nor anything naming dataDir) is left, and returns how long it took. */
export async function waitAllGone(pids: number[], dataDir: string, timeoutMs = 60_000): Promise<number> {
  const started = Date.now();
  await until(
    `every process to exit (left: ${survivors(pids, dataDir).join(", ")})`,
    async () => survivors(pids, dataDir).length === 0,
    timeoutMs,
  );
  return Date.now() - started;
}

/** Kills whatever is left (for cleanup after a failed test). */
export function killAll(pids: number[], dataDir: string) {
  for (const pid of survivors(pids, dataDir)) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {}
  }
}

/** Runs the compiled CLI and returns its exit code and output. */
export function runCli(args: string[], env: Record<string, string>, input?: string) {
  const result = spawnSync(process.execPath, ["bin/engram.mjs", ...args], {
    cwd: ROOT,
    encoding: "utf8",
    input,
    timeout: 120_000,
    env: baseEnv(env),
  });
  return { code: result.status, stdout: result.stdout, stderr: result.stderr };
}
