import { z } from "zod";
import { forTenant } from "../src/db.ts";
import { createTurnSnippets, indexSnippets, syncFactKeys, syncSummarySnippet } from "../src/memory/recall/snippets.ts";
import type { Services } from "../src/services.ts";
import { defineJob } from "./define.ts";

export const indexSnippetsJob = defineJob({
  name: "recall.index",
  schema: z.object({ tenantId: z.string(), snippetIds: z.array(z.string()).min(1).max(256) }),
});

// One job embeds this many snippets at once (a batch for the encoder, one upsert to Chroma).
const PER_JOB = 64;

export async function runIndexSnippets(services: Services, payload: z.infer<typeof indexSnippetsJob.schema>) {
  const result = await indexSnippets(services, payload.tenantId, payload.snippetIds);
  services.log.debug("recall snippets indexed", { tenantId: payload.tenantId, ...result });
  return result;
}

export async function requestIndexing(services: Services, tenantId: string, snippetIds: string[]) {
  for (let i = 0; i < snippetIds.length; i += PER_JOB) {
    await services.jobs.enqueue(indexSnippetsJob, { tenantId, snippetIds: snippetIds.slice(i, i + PER_JOB) });
  }
}

/** After a recorded turn or an import: the new messages become snippets, embedded in the background. */
export async function indexNewMessages(
  services: Services,
  tenantId: string,
  conversationId: string,
  range: { firstSeq: number; lastSeq: number },
) {
  const db = forTenant(services.db, tenantId);
  const ids = await createTurnSnippets(db, conversationId, range);
  // Extraction may have read these messages before their turn had a snippet: its facts' keys
  // could not point anywhere yet.
  const messageIds = ids.length
    ? (await db.recallSnippet.findMany({ where: { id: { in: ids } }, select: { messageIds: true } })).flatMap((s) => s.messageIds)
    : [];
  const keys = messageIds.length && (await db.fact.count({ where: { sourceMessageId: { in: messageIds } } })) ? await indexFactKeys(services, tenantId, conversationId) : [];
  await requestIndexing(services, tenantId, ids);
  return { snippets: ids, factKeys: keys };
}

/** After an accepted summary rewrite: the conversation's SUMMARY snippet follows it. */
export async function indexSummary(services: Services, tenantId: string, conversationId: string) {
  const id = await syncSummarySnippet(forTenant(services.db, tenantId), conversationId);
  if (id) await requestIndexing(services, tenantId, [id]);
}

/** After extraction changed a user's facts: their sentences become keys of their turns (syncFactKeys). */
export async function indexFactKeys(services: Services, tenantId: string, conversationId: string) {
  const conversation = await forTenant(services.db, tenantId).conversation.findUnique({ where: { id: conversationId }, select: { endUserId: true } });
  if (!conversation) return [];
  const ids = await syncFactKeys(services, tenantId, conversation.endUserId);
  await requestIndexing(services, tenantId, ids);
  return ids;
}

/** A recorded turn's messages, or every message of an imported conversation. */
export async function indexNewTurn(
  services: Services,
  tenantId: string,
  conversationId: string,
  turn: { turnId: string } | { imported: true },
) {
  const range =
    "turnId" in turn
      ? await forTenant(services.db, tenantId).turn.findUnique({
          where: { id: turn.turnId },
          select: { firstSeq: true, lastSeq: true },
        })
      : { firstSeq: 1, lastSeq: 2_147_483_647 };
  return range ? indexNewMessages(services, tenantId, conversationId, range) : [];
}
