import { z } from "zod";
import { forTenant } from "../src/db.ts";
import { snippetsToReindex } from "../src/memory/recall/snippets.ts";
import type { Services } from "../src/services.ts";
import { defineJob } from "./define.ts";
import { requestIndexing } from "./index-snippets.ts";

export const reconcileJob = defineJob({
  name: "recall.reconcile",
  schema: z.object({ tenantId: z.string().optional() }).default({}),
});

export const RECONCILE_EVERY = "5 minutes";

// Younger snippets most likely still have their indexing job queued.
const GRACE_MS = 60_000;
const MAX_PER_TENANT = 2_000;

/**
 * Re-queues indexing for snippets without a vector (a crash between the database and Chroma, a
 * long outage) or embedded by a model the tenant no longer uses.
 */
export async function runReconcile(
  services: Services,
  payload: z.infer<typeof reconcileJob.schema>,
  options: { graceMs?: number } = {},
) {
  const tenants = await services.db.tenant.findMany({
    where: { active: true, ...(payload.tenantId ? { id: payload.tenantId } : {}) },
    select: { id: true },
  });
  const requeued: Record<string, number> = {};
  for (const { id: tenantId } of tenants) {
    const { model } = await services.embeddings.forTenant(tenantId);
    const ids = await snippetsToReindex(forTenant(services.db, tenantId), model, {
      olderThan: new Date(Date.now() - (options.graceMs ?? GRACE_MS)),
      limit: MAX_PER_TENANT,
    });
    if (ids.length) {
      await requestIndexing(services, tenantId, ids);
      requeued[tenantId] = ids.length;
    }
  }
  if (Object.keys(requeued).length) services.log.info("recall reconcile re-queued indexing", { requeued });
  return requeued;
}
