import { z } from "zod";
import { forTenant } from "../src/db.ts";
import { createTurnSnippets, indexSnippets, syncSummarySnippet } from "../src/memory/recall/snippets.ts";
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
  const ids = await createTurnSnippets(forTenant(services.db, tenantId), conversationId, range);
  await requestIndexing(services, tenantId, ids);
  return ids;
}

/** After an accepted summary rewrite: the conversation's SUMMARY snippet follows it. */
export async function indexSummary(services: Services, tenantId: string, conversationId: string) {
  const id = await syncSummarySnippet(forTenant(services.db, tenantId), conversationId);
  if (id) await requestIndexing(services, tenantId, [id]);
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
