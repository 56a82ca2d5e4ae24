import { statfs } from "node:fs/promises";
import type { Store } from "./embedded/embedded.ts";
import type { Logger } from "./log.ts";
import type { RedisProbe } from "./pubsub.ts";
import { TimedOut, withTimeout } from "./timeout.ts";

/** The free space, in bytes, that this user may write on the disk holding `dir`. */
export async function freeBytes(dir: string): Promise<number> {
  const disk = await statfs(dir);
  return disk.bavail * disk.bsize;
}

/** One component's state as /healthz reports it. */
export type ComponentHealth = { status: "ok" | "down"; detail?: string };

export type Health = {
  /**
   * ok: everything answers; degraded: recall vectors are unavailable (context still answers),
   * Redis is (subscriptions reach this instance's subscribers only), or due work waits for a worker;
   * down: the store or the queue does not answer.
   */
  status: "ok" | "degraded" | "down";
  /** redis only when REDIS_URL is set. */
  components: { store: ComponentHealth; queue: ComponentHealth; work?: ComponentHealth; chroma: ComponentHealth; redis?: ComponentHealth };
};

/** How late a due job may start before /healthz says the work is not being done (degraded). */
export const WORK_LATE_MS = 5 * 60_000;

const CHECK_TIMEOUT_MS = 3_000;

/**
 * Below this much free space on the embedded store's disk, writes fail (seen: every append failed
 * with "could not extend file … No space left on device" while SELECT 1 answered): PostgreSQL
 * writes its WAL in segments of 16 MB.
 */
const MIN_FREE_BYTES = 16 * 1024 * 1024;

/**
 * Resolves with the check's verdict, or "down" when it throws or takes longer than
 * CHECK_TIMEOUT_MS. /healthz answers without a key, so a failure's own words (a driver's, which
 * may name hosts, ports or paths) go to the log, not into the answer.
 */
async function timed(name: string, check: () => Promise<ComponentHealth>, log?: HealthParts["log"]): Promise<ComponentHealth> {
  try {
    return await withTimeout(check(), CHECK_TIMEOUT_MS, `no answer within ${CHECK_TIMEOUT_MS} ms`);
  } catch (error) {
    if (error instanceof TimedOut) return { status: "down", detail: error.message };
    log?.warn(`health check: the ${name} failed`, { error });
    return { status: "down", detail: "the check failed (the server's log has the error)" };
  }
}

/** What the health check asks: the composition root hands in its parts. */
export type HealthParts = {
  store: Pick<Store, "state" | "kind">;
  /** A trivial query through the API's own database pool. */
  query(): Promise<unknown>;
  /** The embedded store's free disk space, in bytes: a query still answers when no write fits. */
  freeBytes?(): Promise<number>;
  /** `late`: due jobs no worker has started (the work component; absent without it). */
  queue: { ping(): Promise<void>; late?(overMs: number): Promise<{ jobs: number; dueSince: Date | null }> };
  chroma: { health(): Promise<ComponentHealth> };
  /** The pubsub's connection to Redis ("local" without one); optional for callers that have none. */
  pubsub?: { mode(): "local" | "redis" | "degraded"; probe(): Promise<RedisProbe> };
  log?: Pick<Logger, "warn">;
};

/** Redis as the pubsub's clients see it (they reconnect on their own), asked for an answer; none without REDIS_URL. */
async function redisHealth(pubsub: HealthParts["pubsub"]): Promise<ComponentHealth | undefined> {
  if (!pubsub || pubsub.mode() === "local") return undefined;
  switch (await pubsub.probe()) {
    case "answers":
      return { status: "ok" };
    case "silent":
      return { status: "down", detail: "Redis does not answer; subscriptions reach this instance's subscribers only until it does" };
    default:
      return { status: "down", detail: "no connection to Redis; subscriptions reach this instance's subscribers only until it is back" };
  }
}

/**
 * Whether the queue's due work is being done, by whichever worker: jobs due more than
 * WORK_LATE_MS ago and not started, with no job running or finished meanwhile, mean that no
 * worker takes work (none running, or one stuck), and turns, summaries and vectors wait. The API
 * still answers: degraded.
 */
async function workHealth(queue: HealthParts["queue"], log: HealthParts["log"]): Promise<ComponentHealth | undefined> {
  const late = queue.late;
  if (!late) return undefined;
  return timed(
    "work check",
    async () => {
      const { jobs, dueSince } = await late(WORK_LATE_MS);
      if (jobs === 0) return { status: "ok" };
      const minutes = Math.round((Date.now() - (dueSince?.getTime() ?? Date.now())) / 60_000);
      return {
        status: "down",
        detail: `${jobs} job(s) due for up to ${minutes} min have not started, and no job has run for ${WORK_LATE_MS / 60_000} min: no job worker is taking work (is one running?)`,
      };
    },
    log,
  );
}

/** Asks each component, in parallel: the store with a query, the queue on its own pool and for late work, Chroma by heartbeat; Redis as the pubsub sees it. */
export async function checkHealth(services: HealthParts): Promise<Health> {
  const [store, queue, work, chroma, redis] = await Promise.all([
    timed("store", async () => {
      const state = services.store.state();
      if (state !== "up") return { status: "down", detail: `embedded database ${state}` };
      await services.query();
      const free = await services.freeBytes?.();
      if (free !== undefined && free < MIN_FREE_BYTES) {
        return { status: "down", detail: `the data folder's disk has ${Math.floor(free / 1024 / 1024)} MB free: writes fail until space is freed` };
      }
      return { status: "ok", detail: services.store.kind };
    }, services.log),
    timed("queue", async () => {
      await services.queue.ping();
      return { status: "ok" };
    }, services.log),
    workHealth(services.queue, services.log),
    timed("Chroma", () => services.chroma.health(), services.log),
    redisHealth(services.pubsub),
  ]);
  const degraded = [chroma, redis, work].some((part) => part?.status === "down");
  const status = store.status === "down" || queue.status === "down" ? "down" : degraded ? "degraded" : "ok";
  return { status, components: { store, queue, ...(work && { work }), chroma, ...(redis && { redis }) } };
}
