import { OutputParserException } from "@langchain/core/output_parsers";
import type { Runnable } from "@langchain/core/runnables";
import { unreadable } from "../../chains/json.ts";
import type { LossJudgeInput, LossVerdict } from "../../chains/loss-judge.ts";
import { limitWords, type SummarizerInput } from "../../chains/summarizer.ts";
import { countWords } from "../../chains/transcript.ts";
import type { VerbatimJudgeInput, VerbatimScores } from "../../chains/verbatim-judge.ts";
import type { TenantDb } from "../../db.ts";
import type { Logger } from "../../log.ts";
import type { PubSub } from "../../pubsub.ts";
import { agentSettings } from "./agents.ts";
import { underConversationLease } from "./leases.ts";

// The verbatim judge looks at this many of the most recent folded messages.
const VERBATIM_WINDOW = 30;
const MAX_FOLD = 120;

export type SummaryDeps = {
  summarizer: Runnable<SummarizerInput, string>;
  lossJudge: Runnable<LossJudgeInput, LossVerdict>;
  verbatimJudge: Runnable<VerbatimJudgeInput, VerbatimScores>;
  pubsub: PubSub;
  log: Logger;
};

export type RewriteOutcome =
  | { status: "ACCEPTED" | "REJECTED"; revisionId: string; coveredThroughSeq: number; readThroughSeq: number }
  | { status: "NOTHING_TO_FOLD" | "SUMMARY_OFF" | "UNPARSABLE" | "SUPERSEDED" | "BUSY" | "GONE" };

class Superseded extends Error {}

// What a summary folds and the verbatim judge scores: shared, and not forgotten (a tenant that
// keeps forgotten messages keeps them as a record, not as memory), nor kept after a fact read
// from it was deleted (deleteFact: what that fact said is not remembered again, here either).
const shared = (conversationId: string) => ({ conversationId, private: false, forgottenAt: null, factsForgottenAt: null });

/**
 * Folds everything older than the tail into the running summary: rewrite with the summarizer,
 * then let the loss judge decide. A rewrite that lost something the user said is stored as a
 * rejected revision with the reason and the previous summary stays; an accepted one replaces it
 * and the verbatim judge re-scores the older messages. A model answer that cannot be read
 * changes nothing and is logged; a model that cannot be reached throws, so the job retries.
 */
export async function rewriteSummary(db: TenantDb, deps: SummaryDeps, conversationId: string): Promise<RewriteOutcome> {
  // One rewrite per conversation at a time, across workers.
  return underConversationLease(db, conversationId, "summaryLeaseUntil", () =>
    rewriteUnderLease(db, deps, conversationId),
  );
}

/** Whether the conversation has shared messages after `seq` (said since a rewrite read it). */
export async function hasMessagesAfter(db: TenantDb, conversationId: string, seq: number): Promise<boolean> {
  return (await db.message.count({ where: { ...shared(conversationId), seq: { gt: seq } }, take: 1 })) > 0;
}

/** Whether messages older than the tail are still waiting to be folded (the job re-queues then). */
export async function hasUnfoldedMessages(db: TenantDb, conversationId: string): Promise<boolean> {
  const conversation = await db.conversation.findUnique({ where: { id: conversationId }, include: { agent: true } });
  if (!conversation) return false;
  const settings = agentSettings(conversation.agent);
  if (!settings.summaryOn) return false;
  const unfolded = await db.message.count({
    where: { ...shared(conversationId), seq: { gt: conversation.summaryThroughSeq } },
  });
  return unfolded > settings.tailSize;
}

async function rewriteUnderLease(db: TenantDb, deps: SummaryDeps, conversationId: string): Promise<RewriteOutcome> {
  const conversation = await db.conversation.findUnique({ where: { id: conversationId }, include: { agent: true } });
  if (!conversation) return { status: "GONE" };
  const settings = agentSettings(conversation.agent);
  if (!settings.summaryOn) return { status: "SUMMARY_OFF" };

  const unfolded = await db.message.findMany({
    where: { ...shared(conversationId), seq: { gt: conversation.summaryThroughSeq } },
    orderBy: { seq: "asc" },
  });
  // At most MAX_FOLD per call, oldest first, so a long backlog (an import, or summaries just
  // turned on) is folded over several rewrites instead of one prompt no model can take.
  const toFold = unfolded.slice(0, Math.max(0, unfolded.length - settings.tailSize)).slice(0, MAX_FOLD);
  if (toFold.length === 0) return { status: "NOTHING_TO_FOLD" };

  let newSummary: string;
  let verdict: LossVerdict;
  try {
    newSummary = limitWords(
      await deps.summarizer.invoke({
        previousSummary: conversation.summary,
        messages: toFold,
        wordLimit: settings.summaryWordLimit,
      }),
      settings.summaryWordLimit,
    );
    verdict = await deps.lossJudge.invoke({
      previousSummary: conversation.summary,
      newSummary,
      messages: toFold,
    });
  } catch (error) {
    if (!(error instanceof OutputParserException)) throw error;
    deps.log.warn("summary rewrite: the model's answer could not be read; nothing changed", { conversationId, ...unreadable(error) });
    return { status: "UNPARSABLE" };
  }

  const coveredThroughSeq = toFold[toFold.length - 1].seq;
  const accepted = !verdict.lost;
  const revision = await db
    .$transaction(async (tx) => {
      // Only over the summary this rewrite started from: if another rewrite moved it, this one
      // (accepted or rejected) is moot and rolls back whole.
      const { count } = await tx.conversation.updateMany({
        // The summary text too: forgetting clears it, and a rewrite begun before must not bring it back.
        where: { id: conversationId, summaryThroughSeq: conversation.summaryThroughSeq, summary: conversation.summary },
        data: accepted
          ? { summary: newSummary, summaryThroughSeq: coveredThroughSeq }
          : { updatedAt: new Date() },
      });
      if (count === 0) throw new Superseded();
      // Nor over a message it read that a forget has taken (or deleteFact marked) since (the
      // conversation row, locked now, is what the forget's last step takes next: a summary
      // landing before it is cleared).
      // The messages are share-locked until this commits: a forget or deleteFact's mark that
      // comes after waits, and then finds this summary to clear (on PostgreSQL, where the two run
      // at once, a count without the lock let a mark commit between it and this commit unseen).
      const [{ stillThere }] = await tx.$queryRaw<{ stillThere: number }[]>`
        SELECT count(*)::int AS "stillThere" FROM (
          SELECT m."id" FROM "Message" m
          WHERE m."tenantId" = ${db.$tenantId()} AND m."id" = ANY(${toFold.map((m) => m.id)}::text[])
            AND m."forgottenAt" IS NULL AND m."factsForgottenAt" IS NULL
          ORDER BY m."id"
          FOR SHARE
        ) "live"`;
      if (stillThere < toFold.length) throw new Superseded();
      return tx.summaryRevision.create({
        data: {
          tenantId: db.$tenantId(),
          conversationId,
          text: newSummary,
          words: countWords(newSummary),
          coveredThroughSeq,
          accepted,
          reason: verdict.reason || null,
        },
      });
    })
    .catch((error) => {
      if (error instanceof Superseded) return null;
      throw error;
    });
  if (!revision) return { status: "SUPERSEDED" };
  deps.pubsub.publish("summaryChanged", db.$tenantId(), { conversationId, revisionId: revision.id });

  if (accepted) await rescoreOlderMessages(db, deps, conversationId, newSummary, coveredThroughSeq, settings.tailSize);
  return { status: accepted ? "ACCEPTED" : "REJECTED", revisionId: revision.id, coveredThroughSeq, readThroughSeq: unfolded[unfolded.length - 1].seq };
}

/** Asks the verbatim judge which folded messages the next reply still needs word for word. */
async function rescoreOlderMessages(
  db: TenantDb,
  deps: SummaryDeps,
  conversationId: string,
  summary: string,
  throughSeq: number,
  tailSize: number,
) {
  const [older, recent] = await Promise.all([
    db.message.findMany({
      where: { ...shared(conversationId), seq: { lte: throughSeq } },
      orderBy: { seq: "desc" },
      take: VERBATIM_WINDOW,
    }),
    db.message.findMany({
      where: { ...shared(conversationId), seq: { gt: throughSeq } },
      orderBy: { seq: "desc" },
      take: tailSize,
    }),
  ]);
  let scores: VerbatimScores;
  try {
    scores = await deps.verbatimJudge.invoke({ summary, older: older.reverse(), recent: recent.reverse() });
  } catch (error) {
    // The accepted summary is already saved; failing the job now would only retry a rewrite
    // that has nothing left to fold. The next accepted rewrite scores these messages again.
    deps.log.warn("verbatim judge failed; scores unchanged until the next rewrite", {
      conversationId,
      ...(error instanceof OutputParserException ? unreadable(error) : { error: (error as Error).message }),
    });
    return;
  }
  const asked = new Set(older.map((m) => m.seq));
  // One statement, its rows locked in id order as every other writer of messages locks them (a
  // fact's transaction share-locks the messages its extraction read): updates in groups by score
  // could take them in another order and deadlock with it.
  const scored = [...scores].filter(([seq]) => asked.has(seq)).map(([seq, score]) => ({ seq, score }));
  if (scored.length === 0) return;
  await db.$executeRaw`
    WITH picked AS (
      SELECT m."id", s."score" FROM "Message" m
      JOIN jsonb_to_recordset(${JSON.stringify(scored)}::jsonb) AS s("seq" int, "score" int) ON s."seq" = m."seq"
      WHERE m."tenantId" = ${db.$tenantId()} AND m."conversationId" = ${conversationId} AND m."forgottenAt" IS NULL AND m."factsForgottenAt" IS NULL
      ORDER BY m."id"
      FOR NO KEY UPDATE OF m
    )
    UPDATE "Message" SET "keepScore" = picked."score" FROM picked WHERE "Message"."id" = picked."id"`;
}
