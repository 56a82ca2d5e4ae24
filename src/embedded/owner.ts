import { readFileSync, writeFileSync } from "node:fs";

/** What an owner file (<dataDir>/<name>.owner.json) records: the owning process and its port. */
export type Owner = { pid: number; port: number };

export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** The owner file's record, alive or not; null when there is none or it cannot be read. */
export function readOwnerFile(file: string): Owner | null {
  try {
    return JSON.parse(readFileSync(file, "utf8")) as Owner;
  } catch {
    return null;
  }
}

/** The owner file's record when its process is still alive, else null. */
export function liveOwner(file: string): Owner | null {
  const owner = readOwnerFile(file);
  return owner && isAlive(owner.pid) ? owner : null;
}

/** Records this process (or `pid`, a process serving for it), serving on port, as the owner. */
export function writeOwnerFile(file: string, port: number, options: { exclusive?: boolean; pid?: number } = {}): void {
  writeFileSync(file, JSON.stringify({ pid: options.pid ?? process.pid, port } satisfies Owner), options.exclusive ? { flag: "wx" } : undefined);
}
