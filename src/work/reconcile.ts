import type { z } from "zod";
import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { snippetsToReindex, unmarkLostVectors } from "../memory/recall/snippets.ts";
import type { deleteVectorsJob } from "../queue.ts";
import { withTimeout } from "../timeout.ts";
import { queueIndexing } from "./index-snippets.ts";
import { forEachTenant } from "./tenants.ts";

// Younger snippets most likely still have their indexing job queued.
const GRACE_MS = 60_000;
const MAX_PER_TENANT = 2_000;
// The lost-vector check reads the snippets indexed since its last successful run began, less
// this overlap (a vector store dying takes the upserts it acknowledged just before with it);
// a process's first check reaches back an hour, to cover a crash that took the worker down too.
const LOST_CHECK_OVERLAP_MS = 2 * 60_000;
const LOST_CHECK_FIRST_MS = 60 * 60_000;
// A vector store that hangs instead of refusing must not hold the sweep of every other tenant.
const LOST_CHECK_TIMEOUT_MS = 30_000;

/** Per tenant, when this process's last lost-vector check that succeeded began. */
const lostCheckedAt = new Map<string, number>();
// Vector ids the orphan sweep checks per tenant and run, walking the collection a page a minute.
const ORPHAN_PAGE = 2_000;
/** Per tenant and embedding model, where this process's orphan sweep goes on from. */
const orphanOffset = new Map<string, number>();

/**
 * Re-queues indexing for snippets without a vector (a crash between the database and Chroma, a
 * long outage, an acknowledged upsert Chroma lost as it died) or embedded by a model the tenant
 * no longer uses, and deletes vectors whose snippet is gone (removeOrphanVectors).
 */
export async function reconcileRecall(
  deps: Pick<Deps, "tenants" | "embeddings" | "vectors" | "queue" | "log" | "models">,
  payload: { tenantId?: string },
  options: { graceMs?: number } = {},
) {
  const requeued: Record<string, number> = {};
  // One tenant's failure (its embedding route refused, say) never stops the others' reconcile.
  await forEachTenant(
    deps,
    "recall reconcile",
    async ({ id: tenantId }, db) => {
      const { model, offline } = await deps.embeddings.forTenant(tenantId);
      const lost = await findLostVectors(deps, db, tenantId, model);
      await removeOrphanVectors(deps, db, tenantId, model);
      // A remote route's embeddings wait while the budget is spent (their jobs would only be
      // refused); the offline encoder costs no tokens.
      if (!offline && (await deps.models.budgetSpent(tenantId))) return;
      const waiting = await snippetsToReindex(db, model, {
        olderThan: new Date(Date.now() - (options.graceMs ?? GRACE_MS)),
        limit: MAX_PER_TENANT,
      });
      const ids = [...new Set([...waiting, ...lost])];
      await queueIndexing(deps, tenantId, ids);
      if (ids.length) requeued[tenantId] = ids.length;
    },
    payload.tenantId,
  );
  if (Object.keys(requeued).length) deps.log.info("recall reconcile re-queued indexing", { requeued });
  return requeued;
}

/** The tenant's snippets marked indexed whose vector the vector store no longer has (none when it cannot be asked now). */
async function findLostVectors(deps: Pick<Deps, "vectors" | "log">, db: TenantDb, tenantId: string, model: string) {
  const began = Date.now();
  const last = lostCheckedAt.get(tenantId);
  const since = new Date(last === undefined ? began - LOST_CHECK_FIRST_MS : last - LOST_CHECK_OVERLAP_MS);
  try {
    const lost = await withTimeout(
      unmarkLostVectors(db, deps.vectors, model, { since }),
      LOST_CHECK_TIMEOUT_MS,
      `no answer within ${LOST_CHECK_TIMEOUT_MS / 1000} s`,
    );
    lostCheckedAt.set(tenantId, began);
    if (lost.length) deps.log.warn("recall reconcile found indexed snippets without their vector", { tenantId, lost: lost.length });
    return lost;
  } catch (error) {
    // Checked again from the same point next time: the window grows until a check succeeds.
    deps.log.warn("recall reconcile could not check for lost vectors", { tenantId, error: (error as Error).message });
    return [];
  }
}

/**
 * Vectors whose snippet row is gone: what a forget left behind when an index job upserted a
 * vector of a snippet it had read before the forget deleted it, and crashed before it could take
 * it back out. A snippet's row is always written before its vector, so a vector without one is
 * never a write under way. One page of the collection a run, the next page the next run, so a
 * tenant's whole collection is walked in (vectors / ORPHAN_PAGE) runs; then from the start again.
 */
async function removeOrphanVectors(deps: Pick<Deps, "vectors" | "log">, db: TenantDb, tenantId: string, model: string) {
  const key = `${tenantId}\u0000${model}`;
  const offset = orphanOffset.get(key) ?? 0;
  const sweep = async () => {
    const ids = await deps.vectors.idsPage({ tenantId, model }, offset, ORPHAN_PAGE);
    const rows = new Set((await db.recallSnippet.findMany({ where: { id: { in: ids } }, select: { id: true } })).map((s) => s.id));
    const orphans = ids.filter((id) => !rows.has(id));
    if (orphans.length) await deps.vectors.delete(tenantId, { ids: orphans });
    // The orphans deleted were before the next page's start, which moves back by as many.
    orphanOffset.set(key, ids.length < ORPHAN_PAGE ? 0 : offset + ids.length - orphans.length);
    return orphans.length;
  };
  try {
    const removed = await withTimeout(sweep(), LOST_CHECK_TIMEOUT_MS, `no answer within ${LOST_CHECK_TIMEOUT_MS / 1000} s`);
    if (removed) deps.log.warn("recall reconcile deleted vectors whose snippet was gone", { tenantId, orphans: removed });
    return removed;
  } catch (error) {
    deps.log.warn("recall reconcile could not look for orphan vectors", { tenantId, error: (error as Error).message });
    return 0;
  }
}

/** A forget's vector delete the store did not take then (recall.delete-vectors): tried again until it does. */
export function deleteOwedVectors(deps: Pick<Deps, "vectors">, payload: z.infer<typeof deleteVectorsJob.schema>) {
  return deps.vectors.delete(payload.tenantId, payload.selector);
}
