import { linkSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";

/**
 * A process as an owner file names it: its PID and, where /proc tells it, when it started (clock
 * ticks after boot), so that another process given the same PID later is not taken for it.
 */
export type OwnerProcess = { pid: number; started?: number };

/**
 * What an owner file (<dataDir>/<name>.owner.json) records: the owning process, its port, and
 * the child process that has the folder open for it, which outlives it for a few seconds.
 */
export type Owner = OwnerProcess & { port: number; child?: OwnerProcess };

/** The owner files this process has named itself in: a file naming its PID that it never wrote is an earlier process's. */
const ownFiles = new Set<string>();

/** Process `pid`'s state letter and start time from /proc/<pid>/stat (fields 3 and 22); null without /proc. */
function procStat(pid: number): { state: string; started: number } | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Field 2, the command's name, is in parentheses and may hold spaces: count from after it.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return { state: fields[0], started: Number(fields[19]) };
  } catch {
    return null;
  }
}

/** When process `pid` started, in clock ticks after boot; undefined without /proc. */
export function processStarted(pid: number): number | undefined {
  return procStat(pid)?.started;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Whether the process recorded is still the one running under its PID (the PID alone where its start time is not known). */
export function isRunning(recorded: OwnerProcess): boolean {
  if (!isAlive(recorded.pid)) return false;
  const stat = procStat(recorded.pid);
  if (!stat) return true;
  // A zombie has closed its files: it only waits for a parent to reap it (an orphan's may never).
  if (stat.state === "Z" || stat.state === "X") return false;
  return recorded.started === undefined || stat.started === recorded.started;
}

function readText(file: string): string | null {
  try {
    return readFileSync(file, "utf8");
  } catch {
    return null;
  }
}

function parseOwner(text: string | null): Owner | null {
  try {
    return text === null ? null : (JSON.parse(text) as Owner);
  } catch {
    return null;
  }
}

/** The owner file's record, alive or not; null when there is none or it cannot be read. */
export function readOwnerFile(file: string): Owner | null {
  return parseOwner(readText(file));
}

/**
 * Whether the owner `file` records is running. One naming this process counts only if this
 * process wrote it: in a container Engram is PID 1 at every start, so the file a killed one
 * left names the next one.
 */
export function ownerRunning(file: string, owner: OwnerProcess): boolean {
  if (owner.pid === process.pid) return ownFiles.has(path.resolve(file));
  return isRunning(owner);
}

/** The owner file's record when its process is still running, else null. */
export function liveOwner(file: string): Owner | null {
  const owner = readOwnerFile(file);
  return owner && ownerRunning(file, owner) ? owner : null;
}

function record(pid: number, port: number, child?: number): string {
  const owner: Owner = { pid, started: processStarted(pid), port };
  if (child !== undefined) owner.child = { pid: child, started: processStarted(child) };
  return JSON.stringify(owner);
}

/** Creates `file` holding `text` unless it exists; written aside and linked in, so it never exists half-written. */
function createWhole(file: string, text: string): boolean {
  const aside = `${file}.${process.pid}.new`;
  try {
    writeFileSync(aside, text);
    linkSync(aside, file);
    return true;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EEXIST") return false;
    if (code !== "EPERM" && code !== "ENOTSUP" && code !== "ENOSYS") throw error;
    // A file system without hard links: an exclusive create, which a reader may see empty for an instant.
    try {
      writeFileSync(file, text, { flag: "wx" });
      return true;
    } catch (fallback) {
      if ((fallback as NodeJS.ErrnoException).code === "EEXIST") return false;
      throw fallback;
    }
  } finally {
    rmSync(aside, { force: true });
  }
}

/**
 * Removes the record `seen` from `file`: it is moved aside first, and put back if it is not `seen`
 * any more (a process took the file over since), so a claim made meanwhile is never removed.
 */
function removeRecord(file: string, seen: string): void {
  const aside = `${file}.${process.pid}.stale`;
  try {
    renameSync(file, aside);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
    throw error;
  }
  try {
    if (readText(aside) !== seen) linkSync(aside, file);
  } catch {} // claimed again meanwhile: that claim stands
  rmSync(aside, { force: true });
}

/**
 * Makes this process the owner in `file`, on port 0 until it serves: returns null once it is,
 * or the record that `holds` says keeps the file (any other is removed as stale). One process
 * alone wins, however many claim at once.
 */
export function claimOwnerFile(file: string, holds: (owner: Owner) => boolean): Owner | null {
  for (let attempt = 0; attempt < 3; attempt++) {
    if (createWhole(file, record(process.pid, 0))) {
      ownFiles.add(path.resolve(file));
      return null;
    }
    const text = readText(file);
    const owner = parseOwner(text);
    if (owner && holds(owner)) return owner;
    if (text !== null) removeRecord(file, text);
  }
  throw new Error(`${file} was claimed and released by others too often to be claimed; try again.`);
}

/** Removes `file` when the owner it records is not running any more. */
export function clearStaleOwnerFile(file: string): void {
  const text = readText(file);
  const owner = parseOwner(text);
  if (text !== null && !(owner && ownerRunning(file, owner))) removeRecord(file, text);
}

/**
 * Records this process (or `pid`, a process serving for it), serving on port, as the owner, with
 * `child`, the process that has the folder open for it. A record is replaced whole (written aside
 * and renamed): a reader never sees it empty, and never takes the file for a broken one.
 */
export function writeOwnerFile(file: string, port: number, options: { pid?: number; child?: number } = {}): void {
  const pid = options.pid ?? process.pid;
  const aside = `${file}.${process.pid}.new`;
  try {
    writeFileSync(aside, record(pid, port, options.child));
    renameSync(aside, file);
  } catch (error) {
    rmSync(aside, { force: true }); // a full disk leaves it empty
    throw error;
  }
  if (pid === process.pid) ownFiles.add(path.resolve(file));
}
