import type { Store } from "./embedded/embedded.ts";
import type { Logger } from "./log.ts";
import { TimedOut, withTimeout } from "./timeout.ts";

/** One component's state as /healthz reports it. */
export type ComponentHealth = { status: "ok" | "down"; detail?: string };

export type Health = {
  /** ok: everything answers; degraded: recall vectors are unavailable (context still answers); down: the store or the queue does not. */
  status: "ok" | "degraded" | "down";
  components: { store: ComponentHealth; queue: ComponentHealth; chroma: ComponentHealth };
};

const CHECK_TIMEOUT_MS = 3_000;

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
  queue: { ping(): Promise<void> };
  chroma: { health(): Promise<ComponentHealth> };
  log?: Pick<Logger, "warn">;
};

/** Asks each component, in parallel: the store with a query, the queue on its own pool, Chroma by heartbeat. */
export async function checkHealth(services: HealthParts): Promise<Health> {
  const [store, queue, chroma] = await Promise.all([
    timed("store", async () => {
      const state = services.store.state();
      if (state !== "up") return { status: "down", detail: `embedded database ${state}` };
      await services.query();
      return { status: "ok", detail: services.store.kind };
    }, services.log),
    timed("queue", async () => {
      await services.queue.ping();
      return { status: "ok" };
    }, services.log),
    timed("Chroma", () => services.chroma.health(), services.log),
  ]);
  const status = store.status === "down" || queue.status === "down" ? "down" : chroma.status === "down" ? "degraded" : "ok";
  return { status, components: { store, queue, chroma } };
}
