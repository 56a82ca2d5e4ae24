import { OutputParserException } from "@langchain/core/output_parsers";
import type { Runnable } from "@langchain/core/runnables";
import type { CandidateFact, ExtractorInput } from "../../chains/extractor.ts";
import type { FactJudgeInput, FactJudgment } from "../../chains/fact-judge.ts";
import { unreadable } from "../../chains/json.ts";
import type { TenantDb } from "../../db.ts";
import type { Logger } from "../../log.ts";
import { agentSettings } from "../conversations/agents.ts";
import { underConversationLease } from "../conversations/leases.ts";
import { applyCandidate, type CandidateOutcome, type FactDeps } from "./facts.ts";
import { normalizeFact } from "./normalize.ts";

export type ExtractionDeps = FactDeps & {
  extractor: Runnable<ExtractorInput, CandidateFact[]>;
  judge: Runnable<FactJudgeInput, FactJudgment>;
  log: Logger;
};

export type ExtractionResult =
  | { status: "EXTRACTED"; throughSeq: number; outcomes: (CandidateOutcome & { text: string })[] }
  | { status: "WAITING" | "NOTHING_NEW" | "EXTRACTION_OFF" | "UNPARSABLE" | "GONE" | "BUSY" };

type ExtractionOptions = { now?: boolean; beforeSeq?: number };

// One extractor call reads at most this many shared messages; the rest wait for the next batch.
const MAX_BATCH = 40;

/** Marks everything up to a sequence as read by the extractor. */
async function skipExtractionThrough(db: TenantDb, conversationId: string, seq: number) {
  await db.conversation.updateMany({
    where: { id: conversationId, extractedThroughSeq: { lt: seq } },
    data: { extractedThroughSeq: seq },
  });
}

/**
 * Batch extraction: reads the shared messages the extractor has not seen (private steps never
 * count), with what is already known about the user, and runs every candidate through the fact
 * judge. Runs when a batch is full (the agent's batch size, default 8) or, with `now`, when the
 * gate said the turn is worth remembering. Progress is stored per conversation; a candidate the
 * user already has is only refreshed, so running the same batch twice keeps nothing twice.
 * `beforeSeq`: read no message from this seq on (a turn the gate has not judged yet, such as a
 * forget request its round may still write). BUSY: another extraction holds the lease, or a fact
 * it was shown was deleted while the extractor ran (nothing kept: it is read again).
 */
export async function extractFacts(
  db: TenantDb,
  deps: ExtractionDeps,
  conversationId: string,
  options: ExtractionOptions = {},
): Promise<ExtractionResult> {
  // One extraction per conversation at a time, across workers, so a batch is never judged twice
  // against the same stored facts (which would add a fact twice).
  return underConversationLease(db, conversationId, "extractionLeaseUntil", () =>
    extractUnderLease(db, deps, conversationId, options),
  );
}

async function extractUnderLease(
  db: TenantDb,
  deps: ExtractionDeps,
  conversationId: string,
  options: ExtractionOptions,
): Promise<ExtractionResult> {
  const conversation = await db.conversation.findUnique({ where: { id: conversationId }, include: { agent: true } });
  if (!conversation) return { status: "GONE" };
  const settings = agentSettings(conversation.agent);
  if (!settings.extractionOn) return { status: "EXTRACTION_OFF" };

  const batch = await db.message.findMany({
    where: { conversationId, private: false, forgottenAt: null, seq: { gt: conversation.extractedThroughSeq, lt: options.beforeSeq } },
    orderBy: { seq: "asc" },
    take: MAX_BATCH,
  });
  if (batch.length === 0) return { status: "NOTHING_NEW" };
  if (!options.now && batch.length < settings.extractionBatchSize) return { status: "WAITING" };

  const known = await db.fact.findMany({
    where: { endUserId: conversation.endUserId },
    orderBy: [{ core: "desc" }, { confirmedAt: "desc" }],
  });
  let candidates: CandidateFact[];
  try {
    candidates = await deps.extractor.invoke({ known: known.map((f) => f.text), messages: batch });
  } catch (error) {
    if (!(error instanceof OutputParserException)) throw error;
    deps.log.warn("extraction: the model's answer could not be read; nothing kept", { conversationId, ...unreadable(error) });
    return { status: "UNPARSABLE" };
  }
  // A fact it was shown was deleted during the call (a forget, deleteFact): a candidate may say it
  // again from a message that stays ("flat 5 now" updating a forgotten address), and no forget
  // would look for it once done. Nothing is kept; the batch is read again soon, with what is known
  // then (BUSY: the job runs again in a few seconds).
  if (known.length && (await db.fact.count({ where: { id: { in: known.map((f) => f.id) } } })) < known.length) {
    deps.log.info("extraction: a fact it was shown was deleted meanwhile; reading the batch again", { conversationId });
    return { status: "BUSY" };
  }

  const bySeq = new Map(batch.map((m) => [m.seq, m]));
  const outcomes: (CandidateOutcome & { text: string })[] = [];
  for (const candidate of candidates) {
    // Only what the user said: a candidate must point at one of the user's own messages.
    const source = candidate.seq != null ? bySeq.get(candidate.seq) : undefined;
    if (!source || source.role !== "USER") {
      outcomes.push({ change: "DROPPED", reason: "not stated in one of the user's messages", factId: null, text: candidate.text });
      continue;
    }
    const stored = await db.fact.findMany({
      where: { endUserId: conversation.endUserId },
      orderBy: [{ core: "desc" }, { confirmedAt: "desc" }],
    });
    const same = stored.find((f) => normalizeFact(f.text) === normalizeFact(candidate.text));
    let judgment: FactJudgment;
    try {
      judgment = same
        ? { durability: "durable", relation: "same", relatedFactId: same.id, sensitivity: same.sensitivity }
        : await deps.judge.invoke({ candidate: candidate.text, stored: stored.map((f) => ({ id: f.id, text: f.text })) });
    } catch (error) {
      if (!(error instanceof OutputParserException)) throw error;
      deps.log.warn("fact judge: the model's answer could not be read; candidate dropped", { conversationId, ...unreadable(error) });
      outcomes.push({ change: "DROPPED", reason: "the fact judge's answer could not be read", factId: null, text: candidate.text });
      continue;
    }
    const outcome = await applyCandidate(db, deps, {
      endUserId: conversation.endUserId,
      candidate,
      judgment,
      allowSensitive: settings.allowSensitiveFacts,
      sourceMessageId: source.id,
      readMessageIds: batch.map((m) => m.id),
      conversationId,
    });
    outcomes.push({ ...outcome, text: candidate.text });
  }

  const throughSeq = batch[batch.length - 1].seq;
  await skipExtractionThrough(db, conversationId, throughSeq);
  return { status: "EXTRACTED", throughSeq, outcomes };
}
