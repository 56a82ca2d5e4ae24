import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { DEFAULT_AGENT_SETTINGS } from "../memory/conversations/agents.ts";
import { gateByKeywords } from "../memory/gate/gate.ts";
import { createSnippetsOfTurns, indexSnippets, syncFactKeys, type TurnRange } from "../memory/recall/snippets.ts";
import { indexJob, turnJob } from "../queue.ts";

type FollowUpsDeps = Pick<Deps, "queue" | "embeddings" | "vectors" | "log">;

// Turns claimed per round; a round holds its turns' rows for a handful of statements.
const PER_ROUND = 200;
// Snippets per embedding call and Chroma upsert.
const PER_EMBEDDING = 128;

/**
 * The outbox of turns that need no model (batchedFollowUps), drained in batches: each round of
 * up to 200 turns, of any conversations, gets in one short transaction its TURN snippets and the
 * keyword gate's verdicts, and is marked dispatched; then the round's snippets are embedded
 * together and upserted in one call. A turn whose verdict forgets something is left in the
 * outbox for its own turn job, which forgets. Rows are claimed with SKIP LOCKED, so two workers
 * never take the same turn. Nothing is queued inside the transaction: on the embedded store a
 * transaction has the database to itself, and the queue shares it.
 */
export async function runTurnFollowUps(db: TenantDb, deps: FollowUpsDeps, stillAlive: () => Promise<unknown> = async () => {}) {
  const tenantId = db.$tenantId();
  const handedOff: string[] = [];
  let turns = 0;
  let indexed = 0;
  for (let round = 0; round < 1_000; round++) {
    const done = await db.$transaction(async (tx) => {
      const claimed = await tx.$queryRaw<(TurnRange & { id: string })[]>`
        SELECT t."id", t."conversationId", t."firstSeq", t."lastSeq", c."endUserId"
        FROM "Turn" t JOIN "Conversation" c ON c."id" = t."conversationId" JOIN "Agent" a ON a."id" = c."agentId"
        WHERE t."tenantId" = ${tenantId} AND t."followUpsQueuedAt" IS NULL AND t."clientTurnId" NOT LIKE 'import:%'
          AND NOT coalesce((a."settings"->>'summaryOn')::boolean, ${DEFAULT_AGENT_SETTINGS.summaryOn})
          AND NOT coalesce((a."settings"->>'extractionOn')::boolean, ${DEFAULT_AGENT_SETTINGS.extractionOn})
          AND NOT (t."id" = ANY(${handedOff}::text[]))
        ORDER BY t."createdAt"
        LIMIT ${PER_ROUND}
        FOR UPDATE OF t SKIP LOCKED`;
      if (claimed.length === 0) return null;
      const { ids, messages } = await createSnippetsOfTurns(tx as TenantDb, claimed);
      // The user message that opens each turn, for the gate.
      const opening = new Map(messages.filter((m) => m.role === "USER").map((m) => [`${m.conversationId}:${m.seq}`, m.content]));
      const gated = claimed.filter((t) => opening.has(`${t.conversationId}:${t.firstSeq}`));
      const verdicts = await gateByKeywords(
        tx as TenantDb,
        gated.map((t) => ({ conversationId: t.conversationId, message: opening.get(`${t.conversationId}:${t.firstSeq}`)! })),
      );
      const forgetting = new Set(gated.filter((_, i) => verdicts[i].forget !== "NONE").map((t) => t.id));
      await tx.turn.updateMany({
        where: { id: { in: claimed.filter((t) => !forgetting.has(t.id)).map((t) => t.id) } },
        data: { followUpsQueuedAt: new Date() },
      });
      return { claimed: claimed.length, ids, messageIds: messages.map((m) => m.id), forgetting: [...forgetting], endUsers: new Set(claimed.map((t) => t.endUserId)) };
    });
    if (!done) break;
    turns += done.claimed;
    // Still in the outbox: were this enqueue lost, the dispatcher would queue their job. Coalesced
    // per turn, since another round may find the turn again before its job has marked it.
    for (const turnId of done.forgetting) await deps.queue.enqueueCoalesced(turnJob, { tenantId, turnId }, "turnId", 1_000);
    handedOff.push(...done.forgetting);
    // Extraction may have read these messages before their turn had a snippet: the keys of its
    // facts could not point anywhere yet.
    const ids = [...done.ids];
    if (done.messageIds.length && (await db.fact.count({ where: { sourceMessageId: { in: done.messageIds } } }))) {
      for (const endUserId of done.endUsers) ids.push(...(await syncFactKeys(db, deps, endUserId)));
    }
    for (let i = 0; i < ids.length; i += PER_EMBEDDING) {
      const batch = ids.slice(i, i + PER_EMBEDDING);
      try {
        indexed += (await indexSnippets(db, deps, batch)).indexed;
      } catch (error) {
        // The embedder or Chroma is out: an index job retries these with its backoff (and the
        // reconcile sweep finds any snippet left without a vector).
        deps.log.warn("could not index a batch of turn snippets now; an index job will retry", { tenantId, error });
        await deps.queue.enqueue(indexJob, { tenantId, snippetIds: batch });
      }
    }
    await stillAlive();
    if (done.claimed < PER_ROUND) break;
  }
  deps.log.debug("turn follow-ups done", { tenantId, turns, indexed });
  return { turns, indexed };
}
