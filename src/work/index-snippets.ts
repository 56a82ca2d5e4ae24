import type { z } from "zod";
import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { isBudgetExhausted } from "../governance/budget.ts";
import type { VectorDeps } from "../memory/forget.ts";
import { createTurnSnippets, indexSnippets, syncFactKeys } from "../memory/recall/snippets.ts";
import { indexJob } from "../queue.ts";

// The encoder embeds this many snippets at once, with one upsert to Chroma per batch.
const PER_BATCH = 64;

/**
 * Said once when the budget refuses an indexing batch: not an outage, and no retry would get
 * further. The snippets wait without a vector (pending), and the reconcile sweep queues them
 * once the budget is no longer spent.
 */
export function logIndexingPaused(deps: Pick<Deps, "log">, fields: { tenantId: string } & Record<string, unknown>) {
  deps.log.info("recall indexing paused by the monthly token budget; the reconcile sweep queues the rest", fields);
}

/**
 * Recall indexing: a recorded turn's (or an import's) messages become TURN snippets here, in the
 * worker, and every snippet named or made is embedded and upserted. Idempotent: messages that
 * already have a snippet keep it, and a vector upserted twice is the same vector.
 *
 * When the tenant's budget refuses an embedding (a remote route), the job ends `paused` without
 * a retry: the snippets left stay without a vector (recallIndexStatus counts them pending), and
 * the reconcile sweep queues them again once the budget is no longer spent. Retrying here would
 * keep one job per turn polling the budget until the month rolls over.
 */
export async function runIndexSnippets(
  db: TenantDb,
  deps: Pick<Deps, "embeddings" | "vectors" | "log" | "queue">,
  payload: z.infer<typeof indexJob.schema>,
) {
  const ids = [...(payload.snippetIds ?? [])];
  // A range: the job of a turn queued by an older version, which made its snippets here.
  if (payload.conversationId && payload.firstSeq != null && payload.lastSeq != null) {
    ids.push(...(await makeTurnSnippets(db, deps, payload.conversationId, { firstSeq: payload.firstSeq, lastSeq: payload.lastSeq })));
  }
  let indexed = 0;
  for (let i = 0; i < ids.length; i += PER_BATCH) {
    try {
      indexed += (await indexSnippets(db, deps, ids.slice(i, i + PER_BATCH))).indexed;
    } catch (error) {
      if (!isBudgetExhausted(error)) throw error;
      logIndexingPaused(deps, { tenantId: db.$tenantId(), indexed, left: ids.length - i });
      return { indexed, paused: true, reason: error.message };
    }
  }
  deps.log.debug("recall snippets indexed", { tenantId: db.$tenantId(), indexed });
  return { indexed };
}

/**
 * The TURN snippets of messages firstSeq..lastSeq of a conversation, written now, and the keys of
 * facts extraction drew from those messages before they had a snippet (the keys could not point
 * anywhere yet). Returns the ids still to embed.
 */
export async function makeTurnSnippets(
  db: TenantDb,
  deps: VectorDeps,
  conversationId: string,
  range: { firstSeq: number; lastSeq: number },
) {
  const made = await createTurnSnippets(db, conversationId, range);
  const messageIds = made.length
    ? (await db.recallSnippet.findMany({ where: { id: { in: made } }, select: { messageIds: true } })).flatMap((s) => s.messageIds)
    : [];
  const conversation = messageIds.length ? await db.conversation.findUnique({ where: { id: conversationId }, select: { endUserId: true } }) : null;
  if (conversation) made.push(...(await factKeysOf(db, deps, [conversation.endUserId], messageIds)));
  return made;
}

/**
 * Extraction may have read these messages before their turn had a snippet, when the keys of its
 * facts could not point anywhere yet: if any fact came from them, its users' fact keys are synced
 * now (syncFactKeys). Returns the keys' ids still to embed.
 */
export async function factKeysOf(db: TenantDb, deps: VectorDeps, endUserIds: string[], messageIds: string[]) {
  if (messageIds.length === 0 || (await db.fact.count({ where: { sourceMessageId: { in: messageIds } } })) === 0) return [];
  const ids: string[] = [];
  for (const endUserId of new Set(endUserIds)) ids.push(...(await syncFactKeys(db, deps, endUserId)));
  return ids;
}

// Snippets named per index job.
const PER_JOB = 256;

/** Index jobs that embed these snippets, PER_JOB to a job. */
export async function queueIndexing(deps: Pick<Deps, "queue">, tenantId: string, snippetIds: string[]) {
  for (let i = 0; i < snippetIds.length; i += PER_JOB) {
    await deps.queue.enqueue(indexJob, { tenantId, snippetIds: snippetIds.slice(i, i + PER_JOB) });
  }
}

/** After extraction changed a user's facts: their sentences become keys of their turns (syncFactKeys), embedded by an index job. */
export async function indexFactKeys(db: TenantDb, deps: Pick<Deps, "queue" | "vectors" | "log">, conversationId: string) {
  const conversation = await db.conversation.findUnique({ where: { id: conversationId }, select: { endUserId: true } });
  if (!conversation) return [];
  const ids = await syncFactKeys(db, deps, conversation.endUserId);
  await queueIndexing(deps, db.$tenantId(), ids);
  return ids;
}
