import { formatTranscript } from "../../chains/transcript.ts";
import type { TenantDb } from "../../db.ts";
import { notFound } from "../../errors.ts";
import type { Message } from "../../generated/prisma/client.ts";
import { agentSettings } from "./agents.ts";
import { keptMessages, MAX_KEPT, verbatimWindow } from "../context.ts";
import { countTokens, lineBreakTail } from "../tokens.ts";

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
 * Counts transcripts (formatTranscript) of messages that recur from one transcript to the next,
 * tokenizing each message once: a transcript's count is its lines' counts, each but the last
 * with the line break that joins it to the next (lineBreakTail says why that adds up). Beside the
 * whole line, only its end from the last whitespace is counted (twice): short, unless the message
 * holds no whitespace.
 */
function transcriptTokenCounter(): (messages: Message[]) => number {
  const lines = new Map<string, { alone: number; withBreak: number }>();
  const lineOf = (message: Message) => {
    let counts = lines.get(message.id);
    if (!counts) {
      const line = formatTranscript([message]);
      const tail = lineBreakTail(line);
      const alone = countTokens(line);
      counts = { alone, withBreak: alone - countTokens(tail) + countTokens(tail + "\n") };
      lines.set(message.id, counts);
    }
    return counts;
  };
  return (messages) => messages.reduce((sum, m, i) => sum + (i === messages.length - 1 ? lineOf(m).alone : lineOf(m).withBreak), 0);
}

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
  const [turns, revisions] = await Promise.all([
    db.turn.findMany({ where: { conversationId }, orderBy: { lastSeq: "desc" }, take: MAX_POINTS }),
    db.summaryRevision.findMany({
      where: { conversationId, accepted: true },
      orderBy: [{ createdAt: "asc" }, { id: "asc" }],
      select: { id: true, createdAt: true, coveredThroughSeq: true },
    }),
  ]);
  turns.reverse();
  const oldest = turns[0];
  const newest = turns.at(-1);
  if (!oldest || !newest) return [];

  // The summary in force when the next turn arrived (or now, for the last one); its text is read once.
  const inForce = turns.map((turn, index) => {
    if (!settings.summaryOn) return undefined;
    const until = turns[index + 1]?.createdAt ?? new Date();
    return revisions.filter((r) => r.createdAt <= until && r.coveredThroughSeq <= turn.lastSeq).at(-1);
  });
  const summaryIds = [...new Set(inForce.flatMap((r) => (r ? [r.id] : [])))];
  // Every window ends at a turn's last message and spans at most `reach` messages, so only the
  // messages from `reach` before the oldest point on are read, with the best kept candidates
  // before them: the best MAX_KEPT scored 2 or more before a window are among the best
  // MAX_KEPT + reach up to the oldest point.
  const reach = settings.summaryOn ? Math.max(settings.historySize, settings.tailSize) : settings.historySize;
  // What context sends: shared messages, not forgotten (a tenant that keeps forgotten messages keeps them as a record).
  const shared = { conversationId, private: false, forgottenAt: null };
  const [recent, later, keptCandidates, summaries] = await Promise.all([
    db.message.findMany({ where: { ...shared, seq: { lte: oldest.lastSeq } }, orderBy: { seq: "desc" }, take: reach }),
    db.message.findMany({ where: { ...shared, seq: { gt: oldest.lastSeq, lte: newest.lastSeq } }, orderBy: { seq: "asc" } }),
    settings.summaryOn
      ? db.message.findMany({
          where: { ...shared, seq: { lte: oldest.lastSeq }, keepScore: { gte: 2 } },
          orderBy: [{ keepScore: "desc" }, { seq: "desc" }],
          take: MAX_KEPT + reach,
        })
      : [],
    summaryIds.length ? db.summaryRevision.findMany({ where: { id: { in: summaryIds } }, select: { id: true, text: true } }) : [],
  ]);
  const firstRecent = recent.at(-1)?.seq ?? 0;
  const messages = [...keptCandidates.filter((m) => m.seq < firstRecent), ...recent, ...later].sort((a, b) => a.seq - b.seq);
  const summaryTokensOf = new Map(summaries.map((s) => [s.id, countTokens(s.text)]));
  const transcriptTokens = transcriptTokenCounter();

  return turns.map((turn, index) => {
    const upTo = messages.filter((m) => m.seq <= turn.lastSeq);
    const baselineTokens = transcriptTokens(upTo.slice(-settings.historySize));
    if (!settings.summaryOn) {
      return { turnId: turn.id, seq: turn.lastSeq, occurredAt: turn.occurredAt, sentTokens: baselineTokens, baselineTokens, summaryTokens: 0 };
    }
    const summary = inForce[index];
    const window = verbatimWindow(upTo, settings, summary?.coveredThroughSeq ?? 0);
    const firstInWindow = window[0]?.seq ?? Number.MAX_SAFE_INTEGER;
    const kept = keptMessages(upTo.filter((m) => m.seq < firstInWindow));
    // A revision forgotten between the two reads counts as none.
    const summaryTokens = summary ? (summaryTokensOf.get(summary.id) ?? 0) : 0;
    const sentTokens = summaryTokens + transcriptTokens(kept) + transcriptTokens(window);
    return { turnId: turn.id, seq: turn.lastSeq, occurredAt: turn.occurredAt, sentTokens, baselineTokens, summaryTokens };
  });
}
