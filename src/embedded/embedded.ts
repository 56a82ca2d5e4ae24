import { fork, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fromRoot, ROOT } from "../paths.ts";
import type { Logger } from "../log.ts";
import { claimOwnerFile, clearStaleOwnerFile, isRunning, liveOwner, ownerRunning, writeOwnerFile, type Owner } from "./owner.ts";
import { childEnv, recentOutput } from "./child-env.ts";

const childScript = fromRoot("src", "embedded", "pglite-child.mjs");

export type Store = {
  /** PostgreSQL connection string for pg / @prisma/adapter-pg. */
  url: string;
  kind: "embedded" | "postgres";
  /** true on PGlite: LISTEN/NOTIFY does not reach other connections there. */
  embedded: boolean;
  /** The store process: up, being restarted after it died, or given up on. */
  state(): StoreState;
  /** Called once if the store cannot be brought back. */
  onFailure(listener: (error: Error) => void): void;
  stop(): Promise<void>;
  /** Ends an embedded store's process at once, for a shutdown out of time: one frozen or stuck never sees this process go. */
  kill?(): void;
  /** An embedded store this process started: runs the embedded Chroma's server in the database's process. */
  hostChroma?: ChromaHost;
};

/**
 * Starts Chroma's server on `port` with its data in `chromaDir`, in a process that is already
 * there, and says which process, the port it serves (another one's, when one runs there
 * already), and when the server is gone. It cannot be stopped on its own: it ends with its host.
 */
export type ChromaHost = (chromaDir: string, port: number) => Promise<HostedChroma>;
export type HostedChroma = { pid: number; port: number; gone: Promise<void>; output(): string };

/** A hosted Chroma that could not start, or ended before it answered: its host is not asked again. */
export class HostedChromaFailed extends Error {}

export type StoreState = "up" | "restarting" | "failed";

export class StoreBusyError extends Error {
  constructor(dataDir: string, pid: number, options: { orphanWaitMs?: number } = {}) {
    super(
      options.orphanWaitMs === undefined
        ? `The data folder ${dataDir} is already opened by Engram (pid ${pid}). ` +
            "Stop that process first, or run CLI commands while it is up so they go through its store."
        : `The data folder ${dataDir} is still open in the database process (pid ${pid}) of an Engram that exited, ` +
            `and it did not close it within ${Math.round(options.orphanWaitMs / 1000)} s. Stop that process first.`,
    );
    this.name = "StoreBusyError";
  }
}

/** The data folder cannot be used as it is (not writable, not a folder, its disk full); or its database did not start. */
export class DataFolderError extends Error {
  override name = "DataFolderError";
}

/** What the file system says when a folder is not ours to write, or has no room. */
const FOLDER_FAILURES = new Set(["EACCES", "EPERM", "EROFS", "ENOSPC", "EDQUOT", "ENOTDIR", "ENOENT", "EEXIST", "EISDIR"]);

/** A file system failure in the data folder as one line that says what to do; any other error as it is. */
function folderFailure(dir: string, error: unknown): unknown {
  const code = (error as NodeJS.ErrnoException)?.code;
  if (!code || !FOLDER_FAILURES.has(code)) return error;
  return new DataFolderError(
    `The data folder ${dir} (ENGRAM_DATA_DIR) cannot be used: ${(error as Error).message}. ` +
      "Give Engram a folder this user can write, on a disk with free space.",
  );
}

/** A command found the folder's server running, but not the password its database takes. */
export class StoreSecretError extends Error {
  override name = "StoreSecretError";
}

function ownerFile(dataDir: string) {
  return path.join(dataDir, "engram.owner.json");
}

/** The live process that owns the embedded store in dataDir, if any. */
export function readOwner(dataDir: string): Owner | null {
  return liveOwner(ownerFile(dataDir));
}

/**
 * Takes the folder with an exclusive create, so two starting processes cannot both own it. The
 * database process of an owner that died (SIGKILL) has the folder open for up to 5 s more, while it
 * closes it: a start waits up to orphanWaitMs for it to end, so the folder is never opened twice.
 */
async function claimOwnership(dir: string, orphanWaitMs: number) {
  const file = ownerFile(dir);
  const deadline = Date.now() + orphanWaitMs;
  for (;;) {
    const holder = claimOwnerFile(file, (owner) => ownerRunning(file, owner) || (owner.child !== undefined && isRunning(owner.child)));
    if (!holder) return;
    if (ownerRunning(file, holder)) throw new StoreBusyError(dir, holder.pid);
    if (Date.now() > deadline) throw new StoreBusyError(dir, holder.child!.pid, { orphanWaitMs });
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

function urlFor(port: number, password: string) {
  return `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${port}/postgres?sslmode=disable`;
}

/**
 * The data folder's database password: made at its first start, kept in the folder (readable by
 * its owner only, as the folder is), and given to the database's process in its environment, so
 * that only a process of the user who owns the folder can use the loopback port.
 */
function storePassword(dir: string): string {
  const found = readStorePassword(dir);
  if (found) return found;
  // None yet, or one cut short (a full disk): a new one, whole or not at all (written aside, then
  // renamed into place), so the port never goes without.
  const file = secretFile(dir);
  const aside = `${file}.${process.pid}.tmp`;
  try {
    writeFileSync(aside, randomBytes(24).toString("base64url"), { mode: 0o600 });
    renameSync(aside, file);
  } catch (error) {
    rmSync(aside, { force: true });
    throw error;
  }
  return readStorePassword(dir);
}

const secretFile = (dir: string) => path.join(dir, "store.secret");

/** The folder's password as its owner made it, or "" when there is none whole. */
function readStorePassword(dir: string): string {
  try {
    const found = readFileSync(secretFile(dir), "utf8").trim();
    return PASSWORD_SHAPE.test(found) ? found : "";
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return "";
    throw error;
  }
}

/** What storePassword makes: 24 random bytes in base64url. */
const PASSWORD_SHAPE = /^[A-Za-z0-9_-]{32}$/;

/** The data folder, readable by its owner only: it holds the database, its password and the vectors. */
function ownFolder(dir: string) {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  try {
    chmodSync(dir, 0o700);
  } catch {
    // Not ours to change (a folder the operator made for us): its files keep their own modes.
  }
}

export type EmbeddedStoreOptions = {
  log?: Logger;
  /** A client holding a transaction idle this long while others wait is cut off (default 15 s). */
  idleTxMs?: number;
  /** A statement running this long means PGlite is stuck: the child restarts (default 120 s). */
  stuckMs?: number;
  /** How long a start waits for the database process of an Engram that died to close the folder (default 10 s). */
  orphanWaitMs?: number;
};

const MAX_CONNECTIONS = 32;
/**
 * PostgreSQL's WASM runs on V8's baseline compiler only (--liftoff-only): the optimised copies of
 * its hot functions stay in the child for good. In two peers-harness runs of all ten LoCoMo
 * conversations, back to back, without and with the flag (bench/README.md, "Memory footprint"),
 * the child's peak was 265 -> 203 MB and the whole tree's, npm's process included, 667 -> 599 MB,
 * with ingest 217 -> 210 turns/s and recall p50/p95 17.0/29.2 -> 17.5/29.8 ms. Each statement
 * is slower once the optimised code would have been ready (a ~1 ms keyword statement by about
 * 30%, an earlier bare-store measurement of a 10-12 ms statement pair by 35-50%), and faster
 * over its first hundred runs (no optimising compile competing for the cores).
 */
const CHILD_FLAGS = ["--liftoff-only"];
/** A child asked to stop that has not exited after this long is killed (it gives itself 5 s to close the database). */
const STOP_KILL_MS = 8_000;
/** More unexpected exits than this within RESTART_WINDOW_MS and the store is given up. */
const MAX_RESTARTS = 5;
const RESTART_WINDOW_MS = 60_000;

/**
 * The child's stdout (nothing of the database's own; Chroma's banner when it runs there) is kept
 * for a failed start's message, not passed on. Its stderr is passed on line by line, but for
 * Chroma's notice that it has no telemetry configured, printed at each start.
 */
const CHROMA_NOTICE = /^OpenTelemetry is not enabled/;

/** Forks the PGlite child on `port` (0: any) and resolves with the port it serves. */
function forkChild(pgDir: string, port: number, password: string, options: EmbeddedStoreOptions) {
  const child: ChildProcess = fork(
    childScript,
    [pgDir, String(MAX_CONNECTIONS), String(port), String(options.idleTxMs ?? 15_000), String(options.stuckMs ?? 120_000)],
    { stdio: ["ignore", "pipe", "pipe", "ipc"], execArgv: CHILD_FLAGS, env: { ...childEnv(), ENGRAM_STORE_PASSWORD: password } },
  );
  const output = recentOutput(child.stdout, child.stderr);
  let partial = "";
  child.stderr?.on("data", (text: string) => {
    const lines = (partial + text).split("\n");
    partial = lines.pop() ?? "";
    for (const line of lines) if (!CHROMA_NOTICE.test(line)) process.stderr.write(`${line}\n`);
  });
  child.stderr?.on("end", () => {
    if (partial && !CHROMA_NOTICE.test(partial)) process.stderr.write(`${partial}\n`);
  });
  const ready = new Promise<number>((resolve, reject) => {
    // Its own lines on stderr, passed on above, say why (a full disk, a folder it cannot write…).
    const onExit = (code: number | null, signal: NodeJS.Signals | null) =>
      reject(
        new DataFolderError(
          `The embedded database in ${pgDir} ${signal ? `was killed (${signal}) during start-up` : `exited during start-up (code ${code}); its lines above say why`}.`,
        ),
      );
    child.once("exit", onExit);
    child.once("error", reject);
    child.once("message", (message: { port?: number }) => {
      child.off("exit", onExit);
      if (typeof message?.port === "number") resolve(message.port);
      else reject(new Error("The embedded database sent no port."));
    });
  });
  return { child, ready, output };
}

/**
 * Starts PGlite in a child process over the data folder and serves it on a loopback port.
 * The folder has one owner at a time: a second owner is refused, never opened twice.
 * The child is supervised: if it dies, it is restarted on the same port with a growing delay;
 * after MAX_RESTARTS within a minute the store reports "failed" and tells onFailure listeners.
 */
export async function startEmbeddedStore(dataDir: string, options: EmbeddedStoreOptions = {}): Promise<Store> {
  const dir = path.resolve(dataDir);
  const pgDir = path.join(dir, "pg");
  let password: string;
  try {
    ownFolder(dir);
    await claimOwnership(dir, options.orphanWaitMs ?? 10_000);
    password = storePassword(dir);
    // The folder's owner died (SIGKILL) with its embedded Chroma: that Chroma's record goes too.
    clearStaleOwnerFile(path.join(dir, "chroma.owner.json"));
  } catch (error) {
    throw folderFailure(dir, error);
  }

  let { child, ready, output } = forkChild(pgDir, 0, password, options);
  let port: number;
  try {
    // The child is named as soon as it exists: it opens the folder, and can outlive this process.
    writeOwnerFile(ownerFile(dir), 0, { child: child.pid });
    port = await ready;
    writeOwnerFile(ownerFile(dir), port, { child: child.pid });
  } catch (error) {
    child.kill("SIGKILL");
    rmSync(ownerFile(dir), { force: true });
    throw folderFailure(dir, error);
  }

  let state: StoreState = "up";
  let stopping = false;
  const exits: number[] = [];
  const failureListeners: ((error: Error) => void)[] = [];

  const supervise = (current: ChildProcess) =>
    current.once("exit", (code, signal) => {
      if (!stopping) void restart(`exited (code ${code}${signal ? `, ${signal}` : ""})`);
    });
  const restart = async (why: string): Promise<void> => {
    const now = Date.now();
    exits.push(now);
    while (exits[0] < now - RESTART_WINDOW_MS) exits.shift();
    if (exits.length > MAX_RESTARTS) {
      state = "failed";
      const error = new Error(`The embedded database ${why} ${exits.length} times within a minute; giving up.`);
      options.log?.error(error.message);
      for (const listener of failureListeners) listener(error);
      return;
    }
    state = "restarting";
    const delayMs = 250 * 2 ** (exits.length - 1);
    options.log?.error(`the embedded database ${why}; restarting it in ${delayMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, delayMs));
    if (stopping) return;
    ({ child, ready, output } = forkChild(pgDir, port, password, options));
    writeOwnerFile(ownerFile(dir), port, { child: child.pid });
    try {
      await ready;
    } catch (error) {
      child.kill("SIGKILL");
      return restart(`failed to restart (${(error as Error).message})`);
    }
    if (stopping) return;
    state = "up";
    supervise(child);
    options.log?.info("the embedded database is back", { port });
  };
  supervise(child);

  const hostChroma: ChromaHost = async (chromaDir, chromaPort) => {
    while (state === "restarting" && !stopping) await new Promise((resolve) => setTimeout(resolve, 50));
    if (state !== "up" || stopping || !child.connected) throw new Error("The embedded database process is not running.");
    const host = child;
    type Reply = { chromaStarting?: number; chromaRunning?: number; chromaFailed?: string; chromaExited?: number };
    // One listener from before the request: the answer and the end can come in one read.
    let answer!: (result: number | Error) => void;
    const answered = new Promise<number>((resolve, reject) => {
      answer = (result) => (typeof result === "number" ? resolve(result) : reject(result));
    });
    let markGone!: () => void;
    const gone = new Promise<void>((resolve) => (markGone = resolve));
    let servedPort: number | undefined;
    const endedPorts = new Set<number>();
    const onMessage = (message: Reply) => {
      if (message?.chromaFailed !== undefined) answer(new HostedChromaFailed(`Chroma could not start: ${message.chromaFailed}`));
      const served = message?.chromaStarting ?? message?.chromaRunning;
      if (served !== undefined) answer(served);
      if (message?.chromaExited === undefined) return;
      endedPorts.add(message.chromaExited);
      if (message.chromaExited === servedPort) ended();
    };
    const onExit = () => {
      answer(new HostedChromaFailed("The embedded database process exited while starting Chroma."));
      ended();
    };
    const ended = () => {
      host.off("message", onMessage);
      host.off("exit", onExit);
      markGone();
    };
    host.on("message", onMessage);
    host.once("exit", onExit);
    const timer = setTimeout(() => answer(new Error("The embedded database process did not answer a request to start Chroma.")), 10_000);
    host.send({ chroma: { root: ROOT, dir: chromaDir, port: chromaPort } }, (error) => error && answer(error));
    try {
      servedPort = await answered;
    } catch (error) {
      ended();
      throw error;
    } finally {
      clearTimeout(timer);
    }
    if (endedPorts.has(servedPort)) ended();
    return { pid: host.pid!, port: servedPort, gone, output: () => output() };
  };

  let stopped: Promise<void> | undefined;
  return {
    url: urlFor(port, password),
    kind: "embedded",
    embedded: true,
    state: () => state,
    onFailure: (listener) => void failureListeners.push(listener),
    hostChroma,
    kill: () => void child.kill("SIGKILL"),
    stop() {
      stopping = true;
      stopped ??= new Promise<void>((resolve, reject) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        let killed = false;
        // Killed, it did not close the database: a stop that says so, not "closed" (the next start recovers it).
        child.once("exit", () => (killed ? reject(new Error(`the embedded database did not close within ${STOP_KILL_MS / 1000} s and was killed`)) : resolve()));
        if (child.connected) child.send("stop");
        else child.kill("SIGTERM");
        setTimeout(() => {
          killed = child.exitCode === null && child.signalCode === null;
          child.kill("SIGKILL");
        }, STOP_KILL_MS).unref();
      }).finally(() => rmSync(ownerFile(dir), { force: true }));
      return stopped;
    },
  };
}

/**
 * For CLI commands: use the running server's store when there is one (never opening the
 * folder a second time), or own the folder for the length of the command.
 */
export async function attachOrStartEmbeddedStore(dataDir: string, options: EmbeddedStoreOptions = {}): Promise<Store> {
  const dir = path.resolve(dataDir);
  const owner = readOwner(dir);
  if (owner && owner.port > 0) {
    // The running server's password, only read: a new one here would lock this command out and
    // leave the server's restarts a password its database does not take.
    const password = readStorePassword(dir);
    if (!password) {
      throw new StoreSecretError(`The Engram server using ${dir} (pid ${owner.pid}) has no whole store.secret there; restart that server to make one.`);
    }
    return { url: urlFor(owner.port, password), kind: "embedded", embedded: true, state: () => "up", onFailure() {}, stop: async () => {} };
  }
  return startEmbeddedStore(dataDir, options);
}

export function externalStore(url: string): Store {
  return { url, kind: "postgres", embedded: false, state: () => "up", onFailure() {}, stop: async () => {} };
}
