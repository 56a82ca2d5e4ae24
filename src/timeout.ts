/** What withTimeout rejects with, so a caller can tell a wait that ran out from the work's own failure. */
export class TimedOut extends Error {}

/**
 * Settles as `work` does, or rejects with a TimedOut of `message` once `ms` have passed. The work
 * itself is not cancelled: this only stops the caller waiting on it.
 */
export function withTimeout<T>(work: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new TimedOut(message)), ms);
  });
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}
