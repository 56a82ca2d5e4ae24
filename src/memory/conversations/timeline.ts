import { formatTranscript } from "../../chains/transcript.ts";
import type { TenantDb } from "../../db.ts";
import { notFound } from "../../errors.ts";
import { agentSettings } from "./agents.ts";
import { keptMessages, verbatimWindow } from "../context.ts";
import { countTokens } from "../tokens.ts";

export type TimelinePoint = {
  turnId: string;
  /** The last message of the turn. */
  seq: number;
  occurredAt: Date;
  /** Summary, kept messages and tail as the next call after this turn would have sent them. */
  sentTokens: number;
  /** The last history-size messages sent whole. */
  baselineTokens: number;
  summaryTokens: number;
};

const MAX_POINTS = 200;

/**
 * Tokens sent against the baseline after each of a conversation's last turns, recomputed from
 * stored messages and accepted summary revisions rather than recorded per turn: no write on the
 * hot path, and it stays right for conversations that predate it. Only the conversation's own
 * blocks count (summary, kept, tail): facts, entries and recall depend on the next message.
 * Keep scores are today's, so the kept block is an approximation for old points.
 */
export async function contextTimeline(db: TenantDb, conversationId: string): Promise<TimelinePoint[]> {
  const conversation = await db.conversation.findUnique({ where: { id: conversationId }, include: { agent: true } });
  if (!conversation) throw notFound("Conversation", conversationId);
  const settings = agentSettings(conversation.agent);
  const [turns, messages, revisions] = await Promise.all([
    db.turn.findMany({ where: { conversationId }, orderBy: { lastSeq: "desc" }, take: MAX_POINTS }),
    db.message.findMany({ where: { conversationId, private: false }, orderBy: { seq: "asc" } }),
    db.summaryRevision.findMany({
      where: { conversationId, accepted: true },
      orderBy: [{ createdAt: "asc" }, { id: "asc" }],
    }),
  ]);
  turns.reverse();

  return turns.map((turn, index) => {
    // The summary in force when the next turn arrived (or now, for the last one).
    const until = turns[index + 1]?.createdAt ?? new Date();
    const summary = revisions.filter((r) => r.createdAt <= until && r.coveredThroughSeq <= turn.lastSeq).at(-1);
    const upTo = messages.filter((m) => m.seq <= turn.lastSeq);
    const history = upTo.slice(-settings.historySize);
    const baselineTokens = countTokens(formatTranscript(history));
    if (!settings.summaryOn) {
      return { turnId: turn.id, seq: turn.lastSeq, occurredAt: turn.occurredAt, sentTokens: baselineTokens, baselineTokens, summaryTokens: 0 };
    }
    const window = verbatimWindow(upTo, settings, summary?.coveredThroughSeq ?? 0);
    const firstInWindow = window[0]?.seq ?? Number.MAX_SAFE_INTEGER;
    const kept = keptMessages(upTo.filter((m) => m.seq < firstInWindow));
    const summaryTokens = summary ? countTokens(summary.text) : 0;
    const sentTokens =
      summaryTokens +
      (kept.length ? countTokens(formatTranscript(kept)) : 0) +
      (window.length ? countTokens(formatTranscript(window)) : 0);
    return { turnId: turn.id, seq: turn.lastSeq, occurredAt: turn.occurredAt, sentTokens, baselineTokens, summaryTokens };
  });
}
