import type { Deps } from "../deps.ts";
import { turnJob } from "../queue.ts";

// A turn younger than this most likely has its job queued and waiting.
const GRACE_MS = 30_000;
const MAX_PER_TENANT = 1_000;

/**
 * The outbox's dispatcher: turns committed without their follow-ups queued (the process died
 * between the commit and the enqueue, or the queue was down) get their turn job now. Coalesced
 * per turn, so a job that is merely waiting is not doubled.
 */
export async function dispatchPendingTurns(deps: Pick<Deps, "tenants" | "queue" | "log">, options: { graceMs?: number } = {}) {
  const olderThan = new Date(Date.now() - (options.graceMs ?? GRACE_MS));
  const dispatched: Record<string, number> = {};
  for (const tenant of await deps.tenants.active()) {
    const db = deps.tenants.scoped(tenant.id);
    const pending = await db.turn.findMany({
      where: { followUpsQueuedAt: null, createdAt: { lt: olderThan } },
      orderBy: { createdAt: "asc" },
      select: { id: true },
      take: MAX_PER_TENANT,
    });
    for (const turn of pending) {
      await deps.queue.enqueueCoalesced(turnJob, { tenantId: tenant.id, turnId: turn.id }, "turnId", 1_000);
    }
    if (pending.length) dispatched[tenant.id] = pending.length;
  }
  if (Object.keys(dispatched).length) deps.log.info("outbox: queued follow-ups of turns that had none", { dispatched });
  return dispatched;
}
