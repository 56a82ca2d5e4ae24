import type { Services } from "../src/services.ts";
import { indexNewTurn } from "./index-snippets.ts";
import { requestSummary } from "./summarize.ts";
import { extractJob, turnJob } from "./turn.ts";

export type NewMessages = { turnId: string } | { imported: true };

/**
 * The background work new messages start, whoever wrote them (the API or `engram import`): the
 * summary rewrite, the turn's gate and extraction (or, for an import, extraction until caught
 * up), and recall indexing. All of it is derived from stored state, so a follow-up that cannot be
 * queued now is caught up by the next turn's.
 */
export async function afterNewMessages(services: Services, tenantId: string, conversationId: string, added: NewMessages) {
  const followUps: [string, () => Promise<unknown>][] = [
    ["the summary rewrite", () => requestSummary(services, tenantId, conversationId)],
    "turnId" in added
      ? ["the turn's gate and extraction", () => services.jobs.enqueue(turnJob, { tenantId, turnId: added.turnId })]
      : [
          "the imported conversation's extraction",
          () => services.jobs.enqueueCoalesced(extractJob, { tenantId, conversationId }, "conversationId", 1_000),
        ],
    ["recall indexing", () => indexNewTurn(services, tenantId, conversationId, added)],
  ];
  for (const [what, queue] of followUps) {
    try {
      await queue();
    } catch (error) {
      services.log.error(`could not queue ${what}`, { conversationId, error });
    }
  }
}
