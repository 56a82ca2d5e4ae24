import type { Store } from "./embedded/embedded.ts";
import { withTimeout } from "./timeout.ts";

/** One component's state as /healthz reports it. */
export type ComponentHealth = { status: "ok" | "down"; detail?: string };

export type Health = {
  /** ok: everything answers; degraded: recall vectors are unavailable (context still answers); down: the store or the queue does not. */
  status: "ok" | "degraded" | "down";
  components: { store: ComponentHealth; queue: ComponentHealth; chroma: ComponentHealth };
};

const CHECK_TIMEOUT_MS = 3_000;

/** Resolves with the check's verdict, or "down" when it throws or takes longer than CHECK_TIMEOUT_MS. */
async function timed(check: () => Promise<ComponentHealth>): Promise<ComponentHealth> {
  try {
    return await withTimeout(check(), CHECK_TIMEOUT_MS, `no answer within ${CHECK_TIMEOUT_MS} ms`);
  } catch (error) {
    return { status: "down", detail: (error as Error).message.split("\n")[0] };
  }
}

/** What the health check asks: the composition root hands in its parts. */
export type HealthParts = {
  store: Pick<Store, "state" | "kind">;
  /** A trivial query through the API's own database pool. */
  query(): Promise<unknown>;
  queue: { ping(): Promise<void> };
  chroma: { health(): Promise<ComponentHealth> };
};

/** Asks each component, in parallel: the store with a query, the queue on its own pool, Chroma by heartbeat. */
export async function checkHealth(services: HealthParts): Promise<Health> {
  const [store, queue, chroma] = await Promise.all([
    timed(async () => {
      const state = services.store.state();
      if (state !== "up") return { status: "down", detail: `embedded database ${state}` };
      await services.query();
      return { status: "ok", detail: services.store.kind };
    }),
    timed(async () => {
      await services.queue.ping();
      return { status: "ok" };
    }),
    timed(() => services.chroma.health()),
  ]);
  const status = store.status === "down" || queue.status === "down" ? "down" : chroma.status === "down" ? "degraded" : "ok";
  return { status, components: { store, queue, chroma } };
}
