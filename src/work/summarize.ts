import type { z } from "zod";
import { chainFor } from "../chains/registry.ts";
import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { hasMessagesAfter, hasUnfoldedMessages, rewriteSummary } from "../memory/conversations/summary.ts";
import { indexJob, summarizeJob } from "../queue.ts";
import { syncSummaryKeys } from "../memory/recall/snippets.ts";
import { refusalsCounted, UnreadableAnswer } from "./dead-letter.ts";

/** A burst of turns within this window becomes one rewrite covering all of them. */
export const SUMMARIZE_DEBOUNCE_MS = 1_500;

/** Called for every recorded turn: the rewrite runs in the background, coalesced per conversation. */
export function requestSummary(deps: Pick<Deps, "queue">, tenantId: string, conversationId: string) {
  return deps.queue.enqueueCoalesced(summarizeJob, { tenantId, conversationId }, "conversationId", SUMMARIZE_DEBOUNCE_MS);
}

/**
 * One summary rewrite; an accepted one is indexed for recall. `more` says whether turns arrived
 * while it ran (or while another rewrite held the lease), so the job runs again.
 */
export async function runSummarize(
  db: TenantDb,
  deps: Pick<Deps, "models" | "queue" | "pubsub" | "log" | "vectors">,
  payload: z.infer<typeof summarizeJob.schema>,
) {
  const { models, log, pubsub } = deps;
  const tenantId = db.$tenantId();
  const [summarizer, lossJudge, verbatimJudge] = await Promise.all([
    chainFor(models, tenantId, "summary"),
    chainFor(models, tenantId, "loss-judge"),
    chainFor(models, tenantId, "verbatim-judge"),
  ]);
  if (!summarizer || !lossJudge || !verbatimJudge) {
    log.info("summaries are off: no model configured", { conversationId: payload.conversationId });
    return { status: "MODEL_OFF" as const, more: false };
  }
  const outcome = await refusalsCounted(
    "the summary rewrite",
    rewriteSummary(db, { summarizer, lossJudge, verbatimJudge, pubsub, log }, payload.conversationId),
  );
  log.debug("summary rewrite", { conversationId: payload.conversationId, ...outcome });
  if (outcome.status === "ACCEPTED") {
    // Recall indexes the accepted summary; a failure here must not redo the rewrite.
    try {
      const ids = await syncSummaryKeys(db, deps, payload.conversationId);
      if (ids.length) await deps.queue.enqueue(indexJob, { tenantId, snippetIds: ids });
    } catch (error) {
      log.warn("could not queue the summary's recall indexing", { conversationId: payload.conversationId, error });
    }
  }
  if (outcome.status === "UNPARSABLE") throw new UnreadableAnswer("the summary rewrite");
  // A rejected rewrite leaves its messages unfolded: tried again at once it would fold the same
  // ones, and a judge that keeps rejecting them would be asked every few seconds for ever. It is
  // tried again when more is said (this run, if some came while it ran; else the next turn's request).
  const more =
    outcome.status === "REJECTED"
      ? await hasMessagesAfter(db, payload.conversationId, outcome.readThroughSeq)
      : await hasUnfoldedMessages(db, payload.conversationId);
  return { ...outcome, more };
}
