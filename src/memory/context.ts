import { formatTranscript, quoteText } from "../chains/transcript.ts";
import type { TenantDb } from "../db.ts";
import { z } from "zod";
import { EngramError, notFound, parseInput } from "../errors.ts";
import { Prisma, type Message } from "../generated/prisma/client.ts";
import { agentSettings, DEFAULT_AGENT_SETTINGS, externalIdSchema, type AgentSettings } from "./conversations/agents.ts";
import { relevantEntries } from "./log/entries.ts";
import { MESSAGE_LIMITS } from "../limits.ts";
import { countTokens } from "./tokens.ts";

/** A conversation by Engram's id, or by the caller's own ids as recordTurn takes them: exactly one of the two. */
export const contextInput = z
  .object({
    conversationId: z.string().min(1).nullish(),
    agentExternalId: externalIdSchema.nullish(),
    endUserExternalId: externalIdSchema.nullish(),
    conversationExternalId: externalIdSchema.nullish(),
    message: z.string().max(MESSAGE_LIMITS.messageMaxChars),
  })
  .superRefine((input, ctx) => {
    const external = [input.agentExternalId, input.endUserExternalId, input.conversationExternalId];
    const ok = input.conversationId != null ? external.every((id) => id == null) : external.every((id) => id != null);
    if (!ok) {
      ctx.addIssue({
        code: "custom",
        message: "Give either conversationId, or all of agentExternalId, endUserExternalId and conversationExternalId.",
      });
    }
  });

export type ContextInput = z.input<typeof contextInput>;

export type BlockKind = "FACTS" | "ENTRIES" | "RECALL" | "SUMMARY" | "KEPT" | "TAIL";

export type ContextItem = {
  id: string;
  text: string;
  tokens: number;
  seq?: number | null;
  role?: string | null;
  score?: number | null;
};

export type ContextBlock = { kind: BlockKind; title: string; text: string; tokens: number; items: ContextItem[] };

export type AssembledContext = {
  /** Null when the conversation, asked for by external ids, has no turn yet. */
  conversationId: string | null;
  blocks: ContextBlock[];
  totalTokens: number;
  /** What sending the last history-size messages whole would cost. */
  baselineTokens: number;
  savedTokens: number;
  /**
   * Why recall gave less than it would have (keyword matches only, or no recall), in the words
   * of `recall`'s own `degraded`; empty when nothing degraded.
   */
  degraded: string[];
};

// At most this many older messages come back verbatim on the judge's word, essential ones first.
export const MAX_KEPT = 4;
const MAX_ENTRIES = 3;

/**
 * A conversation's newest `count` shared messages (oldest first) and, when `withKept`, the
 * candidates for the KEPT block, in one statement (on the embedded store each statement is a
 * round trip to the database's process, about 3 ms). The KEPT block takes the best MAX_KEPT
 * scored 2 or more before the verbatim window, which starts within the newest `count`: so the
 * best MAX_KEPT + `count` of them hold it, whatever the window turns out to be.
 */
async function conversationMessages(db: TenantDb, conversationId: string, count: number, withKept: boolean) {
  const columns = Prisma.sql`"id", "tenantId", "conversationId", "seq", "role"::text AS "role", "content", "private", "keepScore", "forgottenAt", "factsForgottenAt", "occurredAt", "createdAt"`;
  // Forgotten messages a tenant keeps are a record, not memory: never sent to the agent again.
  const shared = Prisma.sql`"tenantId" = ${db.$tenantId()} AND "conversationId" = ${conversationId} AND NOT "private" AND "forgottenAt" IS NULL`;
  const rows = await db.$queryRaw<(Message & { kept: boolean })[]>`
    (SELECT ${columns}, false AS "kept" FROM "Message" WHERE ${shared} ORDER BY "seq" DESC LIMIT ${count})
    ${withKept ? Prisma.sql`UNION ALL
    (SELECT ${columns}, true AS "kept" FROM "Message" WHERE ${shared} AND "keepScore" >= 2
     ORDER BY "keepScore" DESC, "seq" DESC LIMIT ${MAX_KEPT + count})` : Prisma.empty}`;
  const message = ({ kept: _, ...m }: Message & { kept: boolean }): Message => m;
  return {
    recent: rows.filter((r) => !r.kept).map(message).sort((a, b) => a.seq - b.seq),
    keptCandidates: rows.filter((r) => r.kept).map(message),
  };
}

/**
 * The messages sent word for word. With the summary on: everything it does not cover yet, at
 * least the tail and at most the history size, so a pending or rejected rewrite never drops a
 * message. With it off: the last history-size messages. `recent` is in order, oldest first.
 */
export function verbatimWindow(
  recent: Message[],
  settings: Pick<AgentSettings, "summaryOn" | "tailSize" | "historySize">,
  summaryThroughSeq: number,
): Message[] {
  if (!settings.summaryOn) return recent.slice(-settings.historySize);
  const unfolded = recent.filter((m) => m.seq > summaryThroughSeq);
  return unfolded.length >= settings.tailSize ? unfolded.slice(-settings.historySize) : recent.slice(-settings.tailSize);
}

/** The older messages the verbatim judge kept (scored 2–3): essential first, then the latest, in order. */
export function keptMessages(older: Message[]): Message[] {
  return older
    .filter((m) => (m.keepScore ?? 0) >= 2)
    .sort((a, b) => (b.keepScore ?? 0) - (a.keepScore ?? 0) || b.seq - a.seq)
    .slice(0, MAX_KEPT)
    .sort((a, b) => a.seq - b.seq);
}

function block(kind: BlockKind, title: string, items: ContextItem[], text: string): ContextBlock {
  return { kind, title, text, tokens: countTokens(text), items };
}

function messageBlock(kind: BlockKind, title: string, messages: Message[]): ContextBlock {
  const items = messages.map((m) => {
    const text = formatTranscript([m]);
    return { id: m.id, text, tokens: countTokens(text), seq: m.seq, role: m.role, score: m.keepScore };
  });
  return block(kind, title, items, formatTranscript(messages));
}

/**
 * Blocks contributed by other areas (facts, recall), computed for the same conversation, and
 * why the producer gave less than it would have (`degraded`, passed on to the caller).
 */
export type ExtraBlocks = (input: {
  /** Null for a conversation that has no turn yet. */
  conversationId: string | null;
  endUserId: string;
  message: string;
  settings: AgentSettings;
}) => Promise<{ blocks: ContextBlock[]; degraded: string[] }>;

type Target = {
  conversation: {
    id: string;
    endUserId: string;
    summary: string | null;
    summaryThroughSeq: number;
  } | null;
  endUserId: string;
  settings: AgentSettings;
  /** Whose entries the context includes (relevantEntries matches each with its own scopes). */
  externalIds: { agent: string; endUser: string };
};

/**
 * The conversation `context` is for. By external ids, a conversation that has no turn yet is
 * not an error: its context is what Engram knows of the user beyond it (facts, recall, entries),
 * or nothing when the user is new as well (null).
 */
type ConversationRow = NonNullable<Target["conversation"]> & {
  agentExternalId: string;
  endUserExternalId: string;
  agentSettings: Prisma.JsonValue;
};

/** A conversation with its agent's and user's external ids and the agent's settings: one statement. */
async function conversationRow(db: TenantDb, where: { id: string } | { externalId: string }) {
  const [row] = await db.$queryRaw<ConversationRow[]>`
    SELECT c."id", c."endUserId", c."summary", c."summaryThroughSeq",
           a."externalId" AS "agentExternalId", a."settings" AS "agentSettings", u."externalId" AS "endUserExternalId"
    FROM "Conversation" c JOIN "Agent" a ON a."id" = c."agentId" JOIN "EndUser" u ON u."id" = c."endUserId"
    WHERE c."tenantId" = ${db.$tenantId()}
      AND ${"id" in where ? Prisma.sql`c."id" = ${where.id}` : Prisma.sql`c."externalId" = ${where.externalId}`}`;
  if (!row) return null;
  const { agentExternalId, endUserExternalId, agentSettings: settings, ...conversation } = row;
  return { conversation, agentExternalId, endUserExternalId, settings: agentSettings({ settings }) };
}

async function contextTarget(db: TenantDb, input: z.output<typeof contextInput>): Promise<Target | null> {
  if (input.conversationId != null) {
    const found = await conversationRow(db, { id: input.conversationId });
    if (!found) throw notFound("Conversation", input.conversationId);
    return {
      conversation: found.conversation,
      endUserId: found.conversation.endUserId,
      settings: found.settings,
      externalIds: { agent: found.agentExternalId, endUser: found.endUserExternalId },
    };
  }
  const ids = { agent: input.agentExternalId!, endUser: input.endUserExternalId!, conversation: input.conversationExternalId! };
  const found = await conversationRow(db, { externalId: ids.conversation });
  if (found && (found.agentExternalId !== ids.agent || found.endUserExternalId !== ids.endUser)) {
    throw new EngramError("CONFLICT", `Conversation ${ids.conversation} belongs to another agent or end user.`);
  }
  if (found) {
    return { conversation: found.conversation, endUserId: found.conversation.endUserId, settings: found.settings, externalIds: ids };
  }
  const [agent, endUser] = await Promise.all([
    db.agent.findFirst({ where: { externalId: ids.agent }, select: { settings: true } }),
    db.endUser.findFirst({ where: { externalId: ids.endUser }, select: { id: true } }),
  ]);
  if (!endUser) return null;
  return {
    conversation: null,
    endUserId: endUser.id,
    settings: agent ? agentSettings(agent) : DEFAULT_AGENT_SETTINGS,
    externalIds: ids,
  };
}

/**
 * An agent's prompt material for its next model call: the running summary, older messages the
 * verbatim judge kept, the tail word for word, and the curated entries relevant to the message,
 * each block with its token count against the baseline of sending the recent history whole.
 */
export async function assembleContext(
  db: TenantDb,
  input: ContextInput,
  extraBlocks: ExtraBlocks[] = [],
): Promise<AssembledContext> {
  const parsed = parseInput(contextInput, input);
  const target = await contextTarget(db, parsed);
  if (!target) return { conversationId: null, blocks: [], totalTokens: 0, baselineTokens: 0, savedTokens: 0, degraded: [] };
  const { conversation, settings } = target;

  // The entry search and the producers (facts, recall: the message's embedding, the local recall
  // decision and the search) need only the target, so they start now and overlap the reads of
  // the conversation's own messages below instead of waiting for them.
  const related = Promise.all([
    relevantEntries(db, {
      text: parsed.message,
      agentExternalId: target.externalIds.agent,
      endUserExternalId: target.externalIds.endUser,
      limit: MAX_ENTRIES,
    }),
    ...extraBlocks.map((produce) =>
      produce({ conversationId: conversation?.id ?? null, endUserId: target.endUserId, message: parsed.message, settings }),
    ),
  ]);
  // Should a read below fail first, its error is the one thrown: this one must not go unhandled.
  // The producers then finish on their own (a recall may still be published on the feed for a
  // query that failed), as they did before when the entry search failed first.
  related.catch(() => undefined);

  const { recent, keptCandidates } = conversation
    ? await conversationMessages(db, conversation.id, Math.max(settings.historySize, settings.tailSize), settings.summaryOn)
    : { recent: [], keptCandidates: [] };
  const history = recent.slice(-settings.historySize);

  const window = verbatimWindow(recent, settings, conversation?.summaryThroughSeq ?? 0);
  const blocks: ContextBlock[] = [];
  const kept = keptMessages(keptCandidates.filter((m) => m.seq < (window[0]?.seq ?? 2_147_483_647)));

  const [entries, ...extra] = await related;

  blocks.push(...extra.flatMap((produced) => produced.blocks));
  if (entries.length) {
    const items = entries.map((e) => {
      const text = `- ${quoteText(e.title)}: ${quoteText(e.summary)}`;
      return { id: e.id, text, tokens: countTokens(text), score: e.importance };
    });
    blocks.push(block("ENTRIES", "Relevant notes", items, items.map((i) => i.text).join("\n")));
  }
  if (settings.summaryOn && conversation?.summary) {
    const text = quoteText(conversation.summary);
    blocks.push(block("SUMMARY", "Conversation so far", [{ id: conversation.id, text, tokens: countTokens(text) }], text));
  }
  if (kept.length) blocks.push(messageBlock("KEPT", "Earlier messages still needed", kept));
  if (window.length) blocks.push(messageBlock("TAIL", "Recent messages", window));

  const order: BlockKind[] = ["FACTS", "ENTRIES", "RECALL", "SUMMARY", "KEPT", "TAIL"];
  blocks.sort((a, b) => order.indexOf(a.kind) - order.indexOf(b.kind));
  const totalTokens = blocks.reduce((sum, b) => sum + b.tokens, 0);
  const baselineTokens = countTokens(formatTranscript(history));
  return {
    conversationId: conversation?.id ?? null,
    blocks,
    totalTokens,
    baselineTokens,
    savedTokens: baselineTokens - totalTokens,
    degraded: extra.flatMap((produced) => produced.degraded),
  };
}
