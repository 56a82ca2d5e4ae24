import type { Deps } from "../deps.ts";
import { snippetsToReindex, unmarkLostVectors } from "../memory/recall/snippets.ts";
import { indexJob } from "../queue.ts";

// Younger snippets most likely still have their indexing job queued.
const GRACE_MS = 60_000;
const MAX_PER_TENANT = 2_000;
const PER_JOB = 256;
// A vector lost by a vector store that died is missed within this long of its indexing; the
// sweep runs every minute, so each snippet is checked a few times.
const LOST_CHECK_MS = 5 * 60_000;

/**
 * Re-queues indexing for snippets without a vector (a crash between the database and Chroma, a
 * long outage, an acknowledged upsert Chroma lost as it died) or embedded by a model the tenant
 * no longer uses.
 */
export async function reconcileRecall(
  deps: Pick<Deps, "tenants" | "embeddings" | "vectors" | "queue" | "log">,
  payload: { tenantId?: string },
  options: { graceMs?: number } = {},
) {
  const requeued: Record<string, number> = {};
  for (const { id: tenantId } of await deps.tenants.active(payload.tenantId)) {
    const { model } = await deps.embeddings.forTenant(tenantId);
    const db = deps.tenants.scoped(tenantId);
    // Chroma away: nothing to check against now, and what waits for a vector is re-queued below.
    const lost = await unmarkLostVectors(db, deps.vectors, model, { since: new Date(Date.now() - LOST_CHECK_MS), limit: MAX_PER_TENANT }).catch(
      (error: Error) => (deps.log.warn("recall reconcile could not check vectors", { tenantId, error: error.message }), []),
    );
    if (lost.length) deps.log.warn("recall reconcile found indexed snippets without their vector", { tenantId, lost: lost.length });
    const waiting = await snippetsToReindex(db, model, {
      olderThan: new Date(Date.now() - (options.graceMs ?? GRACE_MS)),
      limit: MAX_PER_TENANT,
    });
    const ids = [...new Set([...lost, ...waiting])];
    for (let i = 0; i < ids.length; i += PER_JOB) {
      await deps.queue.enqueue(indexJob, { tenantId, snippetIds: ids.slice(i, i + PER_JOB) });
    }
    if (ids.length) requeued[tenantId] = ids.length;
  }
  if (Object.keys(requeued).length) deps.log.info("recall reconcile re-queued indexing", { requeued });
  return requeued;
}
