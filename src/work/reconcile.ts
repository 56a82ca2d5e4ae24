import type { Deps } from "../deps.ts";
import { snippetsToReindex } from "../memory/recall/snippets.ts";
import { indexJob } from "../queue.ts";

// Younger snippets most likely still have their indexing job queued.
const GRACE_MS = 60_000;
const MAX_PER_TENANT = 2_000;
const PER_JOB = 256;

/**
 * Re-queues indexing for snippets without a vector (a crash between the database and Chroma, a
 * long outage) or embedded by a model the tenant no longer uses.
 */
export async function reconcileRecall(
  deps: Pick<Deps, "tenants" | "embeddings" | "queue" | "log">,
  payload: { tenantId?: string },
  options: { graceMs?: number } = {},
) {
  const requeued: Record<string, number> = {};
  for (const { id: tenantId } of await deps.tenants.active(payload.tenantId)) {
    const { model } = await deps.embeddings.forTenant(tenantId);
    const ids = await snippetsToReindex(deps.tenants.scoped(tenantId), model, {
      olderThan: new Date(Date.now() - (options.graceMs ?? GRACE_MS)),
      limit: MAX_PER_TENANT,
    });
    for (let i = 0; i < ids.length; i += PER_JOB) {
      await deps.queue.enqueue(indexJob, { tenantId, snippetIds: ids.slice(i, i + PER_JOB) });
    }
    if (ids.length) requeued[tenantId] = ids.length;
  }
  if (Object.keys(requeued).length) deps.log.info("recall reconcile re-queued indexing", { requeued });
  return requeued;
}
