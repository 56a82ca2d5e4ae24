import { forTenant } from "../db.ts";
import type { PubSub } from "../pubsub.ts";
import { forgetSnippets, type SnippetDeps } from "../memory/recall/snippets.ts";

export const DEFAULT_RETENTION_DAYS = 180;

const BATCH = 500;
const DAY_MS = 86_400_000;

export type RetentionResult = { retentionDays: number; cutoff: string | null; snippetsDeleted: number; factsDeleted: number };

/**
 * The retention window of one tenant: recall snippets (rows and vectors) of moments older than
 * the window, and facts not confirmed within it, are deleted. A fact the user restates has been
 * refreshed (confirmedAt) by the facts code and stays. 0 days keeps everything until forgotten.
 */
export async function applyRetention(
  deps: Pick<SnippetDeps, "db" | "vectors" | "log"> & { pubsub: PubSub },
  tenantId: string,
  options: { retentionDays: number; now?: Date },
): Promise<RetentionResult> {
  const { retentionDays } = options;
  if (retentionDays <= 0) return { retentionDays, cutoff: null, snippetsDeleted: 0, factsDeleted: 0 };
  const cutoff = new Date((options.now ?? new Date()).getTime() - retentionDays * DAY_MS);
  const db = forTenant(deps.db, tenantId);

  let factsDeleted = 0;
  for (;;) {
    const facts = await db.fact.findMany({
      where: { confirmedAt: { lt: cutoff } },
      select: { id: true, endUserId: true, text: true },
      take: BATCH,
    });
    if (facts.length === 0) break;
    const { count } = await db.fact.deleteMany({ where: { id: { in: facts.map((f) => f.id) }, confirmedAt: { lt: cutoff } } });
    factsDeleted += count;
    for (const fact of facts) {
      deps.pubsub.publish("factChanged", tenantId, {
        endUserId: fact.endUserId,
        factId: fact.id,
        change: "DELETED",
        reason: `not confirmed within the retention window of ${retentionDays} days`,
        text: fact.text,
        conversationId: null,
      });
    }
  }

  let snippetsDeleted = 0;
  for (;;) {
    const ids = (
      await db.recallSnippet.findMany({ where: { occurredAt: { lt: cutoff } }, select: { id: true }, take: BATCH })
    ).map((s) => s.id);
    if (ids.length === 0) break;
    snippetsDeleted += (await forgetSnippets(deps, tenantId, ids)).deleted;
  }
  // Vectors whose rows went without them (a crash mid-forget) go by their own timestamp.
  await deps.vectors.delete(tenantId, { occurredBefore: cutoff });
  return { retentionDays, cutoff: cutoff.toISOString(), snippetsDeleted, factsDeleted };
}
