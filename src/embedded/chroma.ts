import { fork } from "node:child_process";
import { existsSync, mkdirSync, rmSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { fromRoot, ROOT } from "../paths.ts";
import { claimOwnerFile, isRunning, liveOwner, ownerRunning, readOwnerFile, writeOwnerFile, type Owner } from "./owner.ts";
import { childEnv, recentOutput } from "./child-env.ts";
import { HostedChromaFailed, type ChromaHost, type HostedChroma } from "./embedded.ts";

const childScript = fromRoot("src", "embedded", "chroma-child.mjs");
const chromaPackage = fromRoot("node_modules", "chromadb", "package.json");

/** A Chroma server Engram talks to: one it started, one another Engram process runs, or external. */
export type ChromaServer = {
  url: string;
  /** The server's process, when this process started it: on the embedded store, the database's. */
  pid?: number;
  /** false once a Chroma this process started has exited. */
  alive(): boolean;
  stop(): Promise<void>;
};

const ownerFile = (dataDir: string) => path.join(dataDir, "chroma.owner.json");

/** Another process serves the embedded Chroma of this folder, or is starting it. */
export class ChromaBusyError extends Error {}

/** The live Chroma another process started for dataDir, if any. */
function readOwner(dataDir: string): Owner | null {
  const owner = liveOwner(ownerFile(dataDir));
  return owner && owner.pid !== process.pid && owner.port > 0 ? owner : null;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

export async function heartbeat(url: string, timeoutMs = 1_000): Promise<boolean> {
  try {
    const response = await fetch(`${url}/api/v2/heartbeat`, { signal: AbortSignal.timeout(timeoutMs) });
    return response.ok;
  } catch {
    return false;
  }
}

/** Chroma in a process of its own (chroma-child.mjs), which dies with Engram's. */
function forkChroma(chromaDir: string, port: number): HostedChroma & { kill(): void; stop(): void } {
  const child = fork(childScript, [ROOT, chromaDir, String(port)], {
    stdio: ["ignore", "pipe", "pipe", "ipc"],
    execArgv: [],
    env: childEnv(),
  });
  return {
    pid: child.pid!,
    port,
    gone: new Promise<void>((resolve) => child.once("exit", () => resolve())),
    output: recentOutput(child.stdout, child.stderr),
    kill: () => child.kill("SIGKILL"),
    stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      if (child.connected) child.send("stop");
      else child.kill("SIGTERM");
      // Whatever state it is in, it is gone within 5 s.
      setTimeout(() => child.kill("SIGKILL"), 5_000).unref();
    },
  };
}

/**
 * Starts Chroma (the server of the `chromadb` npm package) on a free loopback port with its data
 * in `<dataDir>/chroma`, and waits for its heartbeat: in `host` (the embedded database's
 * process, where it ends with that process), or else in a process of its own that dies with
 * Engram's.
 */
export async function startEmbeddedChroma(
  dataDir: string,
  options: { port?: number; timeoutMs?: number; host?: ChromaHost } = {},
): Promise<ChromaServer> {
  const timeoutMs = options.timeoutMs ?? 30_000;
  const dir = path.resolve(dataDir);
  mkdirSync(path.join(dir, "chroma"), { recursive: true });
  if (!existsSync(chromaPackage)) throw new Error(`Chroma is not installed (${chromaPackage} is missing): run npm install.`);
  // Never a second server on the same folder: the folder is claimed before a server starts (one
  // that another process owns, or is starting, is reused by attachOrStartEmbeddedChroma), and one
  // this process started must be gone before it starts again.
  const file = ownerFile(dir);
  const holder = claimOwnerFile(file, (owner) => ownerRunning(file, owner));
  if (holder) throw new ChromaBusyError(`The embedded Chroma in ${dir} is owned by another process (pid ${holder.pid}).`);
  const chromaDir = path.join(dir, "chroma");
  let own: ReturnType<typeof forkChroma> | null = null;
  let server: HostedChroma;
  let exited = false;
  try {
    const port = options.port ?? (await freePort());
    own = options.host ? null : forkChroma(chromaDir, port);
    server = own ?? (await options.host!(chromaDir, port));
    const started = server;
    void started.gone.then(() => {
      exited = true;
      const owner = readOwnerFile(file);
      if (owner?.pid === started.pid && owner.port === started.port) rmSync(file, { force: true });
    });
    const url = `http://127.0.0.1:${server.port}`;
    const deadline = Date.now() + timeoutMs;
    while (!(await heartbeat(url, 500))) {
      if (exited || Date.now() > deadline) {
        own?.kill();
        const detail = server.output().trim().split("\n").slice(-3).join(" ");
        const message = `The embedded Chroma did not start on ${url}${detail ? `: ${detail}` : ""}`;
        // A hosted one still starting is left to start: the next request is told its port.
        throw exited && !own ? new HostedChromaFailed(message) : new Error(message);
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  } catch (error) {
    const owner = readOwnerFile(file);
    if (owner?.pid === process.pid && owner.port === 0) rmSync(file, { force: true }); // this process's claim
    throw error;
  }
  // The process that serves it: one that outlives this one (the database's, for up to its 5 s
  // stop) keeps the folder from a second Chroma until it is gone.
  writeOwnerFile(file, server.port, { pid: server.pid });
  const url = `http://127.0.0.1:${server.port}`;

  return {
    url,
    pid: server.pid,
    alive: () => !exited,
    stop() {
      // A hosted server ends with its host (the store stops after Chroma's clients are closed).
      if (!own) return Promise.resolve();
      own.stop();
      return own.gone;
    },
  };
}

/**
 * The embedded Chroma for this data folder: the one a running Engram already serves (so a CLI
 * command never opens the folder twice), or a new one this process owns.
 */
export async function attachOrStartEmbeddedChroma(dataDir: string, host?: ChromaHost, timeoutMs = 30_000): Promise<ChromaServer> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const owner = readOwner(path.resolve(dataDir));
    if (owner) {
      const url = `http://127.0.0.1:${owner.port}`;
      if (await heartbeat(url)) return { url, alive: () => isRunning(owner), stop: async () => {} };
    }
    try {
      return await startEmbeddedChroma(dataDir, { host });
    } catch (error) {
      // Another process is starting it: it is reused once it answers.
      if (!(error instanceof ChromaBusyError) || Date.now() > deadline) throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

export function externalChroma(url: string): ChromaServer {
  return { url: url.replace(/\/+$/, ""), alive: () => true, stop: async () => {} };
}

/**
 * The Chroma recall uses, resolved on first use (so a CLI command that never recalls starts
 * nothing; the server asks for it as it starts): CHROMA_URL when set, else the embedded one,
 * started again if it died.
 */
export type LazyChroma = ReturnType<typeof lazyChroma>;

export function lazyChroma(options: {
  url?: string;
  dataDir: string;
  /** Where to run the embedded Chroma (the embedded database's process), else its own process. */
  host?: ChromaHost;
  onStart?: (url: string) => void;
  /** A hosted Chroma failed to start: from now on it runs in a process of its own. */
  onHostGivenUp?: (error: Error) => void;
  /** The embedded Chroma failed to start, the first time since it last ran. */
  onStartFailed?: (error: Error) => void;
  /** A health check this long after a failed start tries it again (default 30 s). */
  startRetryMs?: number;
}) {
  const startRetryMs = options.startRetryMs ?? 30_000;
  let host = options.host;
  let current: ChromaServer | undefined;
  // Why the last start failed, until one succeeds: /healthz says down, not "starts on first use".
  let failed: Error | undefined;
  let failedAt = 0;
  let starting: Promise<ChromaServer> | undefined;
  let closed = false;
  const chroma = {
    /** For /healthz: the heartbeat of the Chroma in use; an embedded one not started yet is fine. */
    async health(): Promise<{ status: "ok" | "down"; detail?: string }> {
      if (failed) {
        // Tried again from here too, not only on the next recall: a cause fixed while the
        // instance is idle (a full disk, a file in the way) would otherwise keep it down.
        if (!starting && !closed && Date.now() - failedAt >= startRetryMs) void chroma.get().catch(() => {});
        // Its code (EEXIST, EACCES…) but not its message, which names paths: /healthz needs no key.
        const code = (failed as NodeJS.ErrnoException).code;
        const every = `${Math.round(startRetryMs / 1000)} s`;
        return { status: "down", detail: `the embedded Chroma failed to start${code ? ` (${code})` : ""}; it is tried again on next use, and by a health check every ${every}` };
      }
      const url = options.url ?? current?.url;
      if (!url) return { status: "ok", detail: starting ? "embedded; starting" : "embedded; starts on first use" };
      if (!options.url && !current?.alive()) {
        // Started again now, not on the next recall: an idle instance would say down for ever.
        if (!closed) void chroma.get().catch(() => {});
        return { status: "down", detail: "the embedded Chroma exited; it is being started again" };
      }
      return (await heartbeat(url, 1_500))
        ? { status: "ok", detail: options.url ? "external" : "embedded" }
        : { status: "down", detail: options.url ? "no heartbeat from the external Chroma (CHROMA_URL)" : "no heartbeat from the embedded Chroma" };
    },
    get(): Promise<ChromaServer> {
      if (closed) return Promise.reject(new Error("Chroma is closed."));
      if (current?.alive()) return Promise.resolve(current);
      starting ??= (async () => {
        try {
          // A Chroma that cannot start where it is hosted (a panic there ends the database's
          // process too) is not tried there again: one failure, then a process of its own.
          current = options.url
            ? externalChroma(options.url)
            : await attachOrStartEmbeddedChroma(options.dataDir, host).catch((error: Error) => {
                if (!(error instanceof HostedChromaFailed)) throw error;
                host = undefined;
                options.onHostGivenUp?.(error);
                return attachOrStartEmbeddedChroma(options.dataDir);
              });
          failed = undefined;
          if (!options.url) options.onStart?.(current.url);
          return current;
        } catch (error) {
          if (!failed) options.onStartFailed?.(error as Error);
          failed = error as Error;
          failedAt = Date.now();
          throw error;
        } finally {
          starting = undefined;
        }
      })();
      return starting;
    },
    async stop() {
      closed = true;
      await starting?.catch(() => {});
      await current?.stop();
    },
  };
  return chroma;
}
