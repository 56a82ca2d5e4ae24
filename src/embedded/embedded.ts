import { fork, type ChildProcess } from "node:child_process";
import { mkdirSync, rmSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { liveOwner, writeOwnerFile, type Owner } from "./owner.ts";

const childScript = fileURLToPath(new URL("./pglite-child.mjs", import.meta.url));

export type Store = {
  /** PostgreSQL connection string for pg / @prisma/adapter-pg. */
  url: string;
  kind: "embedded" | "postgres";
  /** true on PGlite: LISTEN/NOTIFY does not reach other connections there. */
  embedded: boolean;
  stop(): Promise<void>;
};

export class StoreBusyError extends Error {
  constructor(dataDir: string, pid: number) {
    super(
      `The data folder ${dataDir} is already opened by Engram (pid ${pid}). ` +
        "Stop that process first, or run CLI commands while it is up so they go through its store.",
    );
    this.name = "StoreBusyError";
  }
}

function ownerFile(dataDir: string) {
  return path.join(dataDir, "engram.owner.json");
}

/** The live process that owns the embedded store in dataDir, if any. */
export function readOwner(dataDir: string): Owner | null {
  return liveOwner(ownerFile(dataDir));
}

/** Takes the folder with an exclusive create, so two starting processes cannot both own it. */
function claimOwnership(dir: string) {
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      writeOwnerFile(ownerFile(dir), 0, { exclusive: true });
      return;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      const owner = readOwner(dir);
      if (owner) throw new StoreBusyError(dir, owner.pid);
      rmSync(ownerFile(dir), { force: true }); // left behind by a process that died
    }
  }
  throw new StoreBusyError(dir, -1);
}

function urlFor(port: number) {
  return `postgres://postgres@127.0.0.1:${port}/postgres?sslmode=disable`;
}

/**
 * Starts PGlite in a child process over the data folder and serves it on a loopback port.
 * The folder has one owner at a time: a second owner is refused, never opened twice.
 */
export async function startEmbeddedStore(dataDir: string): Promise<Store> {
  const dir = path.resolve(dataDir);
  mkdirSync(dir, { recursive: true });
  claimOwnership(dir);

  const child: ChildProcess = fork(childScript, [path.join(dir, "pg")], {
    stdio: ["ignore", "inherit", "inherit", "ipc"],
    execArgv: [],
  });
  let port: number;
  try {
    port = await new Promise<number>((resolve, reject) => {
      child.once("exit", (code) =>
        reject(new Error(`The embedded database exited during start-up (code ${code}).`)),
      );
      child.once("error", reject);
      child.once("message", (message: { port?: number }) =>
        typeof message?.port === "number"
          ? resolve(message.port)
          : reject(new Error("The embedded database sent no port.")),
      );
    });
  } catch (error) {
    child.kill("SIGKILL");
    rmSync(ownerFile(dir), { force: true });
    throw error;
  }
  writeOwnerFile(ownerFile(dir), port);

  let stopped: Promise<void> | undefined;
  return {
    url: urlFor(port),
    kind: "embedded",
    embedded: true,
    stop() {
      stopped ??= new Promise<void>((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.once("exit", () => resolve());
        if (child.connected) child.send("stop");
        else child.kill("SIGTERM");
        setTimeout(() => child.kill("SIGKILL"), 10_000).unref();
      }).finally(() => rmSync(ownerFile(dir), { force: true }));
      return stopped;
    },
  };
}

/**
 * For CLI commands: use the running server's store when there is one (never opening the
 * folder a second time), or own the folder for the length of the command.
 */
export async function attachOrStartEmbeddedStore(dataDir: string): Promise<Store> {
  const owner = readOwner(path.resolve(dataDir));
  if (owner && owner.port > 0) {
    return { url: urlFor(owner.port), kind: "embedded", embedded: true, stop: async () => {} };
  }
  return startEmbeddedStore(dataDir);
}

export function externalStore(url: string): Store {
  return { url, kind: "postgres", embedded: false, stop: async () => {} };
}
