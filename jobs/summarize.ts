import { z } from "zod";
import { createLossJudgeChain } from "../src/chains/loss-judge.ts";
import { createSummarizerChain } from "../src/chains/summarizer.ts";
import { createVerbatimJudgeChain } from "../src/chains/verbatim-judge.ts";
import { forTenant } from "../src/db.ts";
import { hasUnfoldedMessages, rewriteSummary } from "../src/memory/conversations/summary.ts";
import type { Services } from "../src/services.ts";
import { defineJob } from "./define.ts";
import { indexSummary } from "./index-snippets.ts";

export const summarizeJob = defineJob({
  name: "memory.summarize",
  schema: z.object({ tenantId: z.string(), conversationId: z.string() }),
});

/** A burst of turns within this window becomes one rewrite covering all of them. */
export const SUMMARIZE_DEBOUNCE_MS = 1_500;

export async function runSummarize(services: Services, payload: z.infer<typeof summarizeJob.schema>) {
  const { models, log, pubsub } = services;
  const [summarizer, lossJudge, verbatimJudge] = await Promise.all([
    models.chat(payload.tenantId, "cheap", "summary"),
    models.chat(payload.tenantId, "cheap", "loss-judge"),
    models.chat(payload.tenantId, "cheap", "verbatim-judge"),
  ]);
  if (!summarizer || !lossJudge || !verbatimJudge) {
    log.info("summaries are off: no model configured", { conversationId: payload.conversationId });
    return { status: "MODEL_OFF" as const };
  }
  const tenantDb = forTenant(services.db, payload.tenantId);
  const outcome = await rewriteSummary(
    tenantDb,
    {
      summarizer: createSummarizerChain(summarizer),
      lossJudge: createLossJudgeChain(lossJudge),
      verbatimJudge: createVerbatimJudgeChain(verbatimJudge),
      pubsub,
      log,
    },
    payload.conversationId,
  );
  log.debug("summary rewrite", { conversationId: payload.conversationId, ...outcome });
  if (outcome.status === "ACCEPTED") {
    // Recall indexes the accepted summary; a failure here must not redo the rewrite.
    await indexSummary(services, payload.tenantId, payload.conversationId).catch((error) =>
      log.warn("could not queue the summary's recall indexing", { conversationId: payload.conversationId, error }),
    );
  }
  // Turns that arrived while this rewrite ran (or while another held the lease) need another one.
  const more = outcome.status !== "UNPARSABLE" && (await hasUnfoldedMessages(tenantDb, payload.conversationId));
  return { ...outcome, more };
}

/** Called after every recorded turn: the rewrite runs in the background, coalesced per conversation. */
export function requestSummary(services: Services, tenantId: string, conversationId: string) {
  return services.jobs.enqueueCoalesced(summarizeJob, { tenantId, conversationId }, "conversationId", SUMMARIZE_DEBOUNCE_MS);
}
