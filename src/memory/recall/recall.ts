import { randomUUID } from "node:crypto";
import { OutputParserException } from "@langchain/core/output_parsers";
import { unreadable } from "../../chains/json.ts";
import { chainFor } from "../../chains/registry.ts";
import type { RerankScores } from "../../chains/rerank.ts";
import { quoteText } from "../../chains/transcript.ts";
import type { TenantDb } from "../../db.ts";
import { Prisma } from "../../generated/prisma/client.ts";
import { EngramError, publicReason } from "../../errors.ts";
import { isBudgetExhausted } from "../../governance/budget.ts";
import { isModelCallLimit } from "../../models/call-budget.ts";
import { TimedOut } from "../../timeout.ts";
import type { ModelProvider } from "../../models/provider.ts";
import type { PubSub, RecallCandidate, RecallEvent } from "../../pubsub.ts";
import { sparingly, type Logger } from "../../log.ts";
import type { ContextBlock, ExtraBlocks } from "../context.ts";
import { needsRecallByKeywords } from "../gate/keywords.ts";
import type { SnippetDeps } from "./snippets.ts";
import { countTokens } from "../tokens.ts";
import { fuseHits } from "./fusion.ts";
import { resolveTimeHint, type TimeHint } from "./time.ts";

export type RecallDeps = SnippetDeps & { models: ModelProvider; pubsub: PubSub };

export type RecallMode = "HYBRID" | "VECTOR" | "KEYWORD";

export type { RecallCandidate, RecallEvent };

/**
 * The product's numbers: 10 candidates (30 when a judge chooses), at most 3 injected, judge
 * score 2 or more. The ranking constants were chosen on the tuning half of LoCoMo only
 * (bench/README.md, "LoCoMo evidence recall"), as the sweep's best that keeps 3.5 distinct
 * conversations in the top 5: RRF k 1 lets each retriever's first ranks count, BM25 weighs 2.5
 * against the offline encoder's 1, each retriever brings 40, a snippet in the time the message
 * names gains 0.3, keyword hits under 5% of the best one's BM25 are dropped, a found turn gains
 * 0.2 of its best found neighbour's score (the answer is often one turn away), and one
 * conversation takes at most 3 of the first 5 places while another's snippet waits.
 */
export const RECALL = {
  candidates: 10,
  judgeCandidates: 30,
  inject: 3,
  minJudgeScore: 2,
  rrfK: 1,
  keywordWeight: 2.5,
  pool: 40,
  perConversation: 3,
  diversityWindow: 5,
  timeBoost: 0.3,
  keywordFloor: 0.05,
  neighbourWeight: 0.2,
} as const;

export type SearchInput = {
  endUserId: string;
  text: string;
  excludeConversationId?: string | null;
  k: number;
  mode?: RecallMode;
  /** When the message was said, to resolve "last Tuesday" or "two months ago" (default now). */
  at?: Date;
  /** The text's embedding by the tenant's embedder, when the caller has it already (no second embedding). */
  vector?: number[] | null;
};

type ReadBack = {
  id: string;
  kind: RecallCandidate["kind"];
  text: string;
  conversationId: string;
  messageIds: string[];
  /** The seq of each of messageIds, in the same order (stored with the snippet). */
  messageSeqs: number[];
  occurredAt: Date;
  keyOfId: string | null;
  indexedAt: Date | null;
};

const SNIPPET_COLUMNS = Prisma.sql`s."id", s."kind"::text AS "kind", s."text", s."conversationId", s."messageIds", s."messageSeqs", s."occurredAt", s."keyOfId", s."indexedAt"`;

/** The user's snippets among `ids`, in one statement. */
function readBack(db: TenantDb, input: SearchInput, ids: string[]) {
  return db.$queryRaw<ReadBack[]>`
    SELECT ${SNIPPET_COLUMNS}
    FROM "RecallSnippet" s
    WHERE s."tenantId" = ${db.$tenantId()} AND s."endUserId" = ${input.endUserId} AND s."id" = ANY(${ids}::text[])
      ${input.excludeConversationId ? Prisma.sql`AND s."conversationId" <> ${input.excludeConversationId}` : Prisma.empty}`;
}

/** Okapi BM25's usual constants: term-frequency saturation and document-length normalisation. */
const BM25 = { k1: 1.2, b: 0.75 } as const;

/**
 * Full-text hits ranked by Okapi BM25 over the end user's own snippets: any of the message's
 * lexemes may match (an OR, English stemming and stop words), each weighted by its inverse
 * document frequency among that user's snippets, so the words every snippet shares (the user's
 * and the assistant's names, "today") count for almost nothing and a rare one for a lot.
 * PostgreSQL's ts_rank_cd has no such weight, and it was what held the keyword side back on
 * LoCoMo (bench/README.md). The statistics are computed per query from the user's tsvectors.
 * Returns the hits' snippets with their scores (no read-back after it).
 */
async function keywordHits(db: TenantDb, input: SearchInput, limit: number) {
  const tenantId = db.$tenantId();
  const own = Prisma.sql`s."tenantId" = ${tenantId} AND s."endUserId" = ${input.endUserId}
    ${input.excludeConversationId ? Prisma.sql`AND s."conversationId" <> ${input.excludeConversationId}` : Prisma.empty}`;
  // The user's snippets are read once, for the statistics and the matches. Of each snippet only
  // the message's lexemes are unnested: setweight marks them and ts_filter keeps the marked ones
  // (none for a snippet that holds none), so a snippet yields a row per lexeme it shares with the
  // message, with its positions, instead of a row per lexeme it holds. The same hits, scores and
  // order as unnesting every lexeme, 11.4 -> 3.4 ms per statement in PGlite on the peers
  // harness's LoCoMo store (bench/README.md, "Recall latency: goal and what remains"). Were the
  // column ever given weights, setweight's marks would need another weight than any stored.
  return db.$queryRaw<(ReadBack & { rank: number })[]>`
    WITH q AS (SELECT tsvector_to_array(to_tsvector('english', ${input.text})) AS terms),
    docs AS MATERIALIZED (SELECT s."id", s."search", s."occurredAt" FROM "RecallSnippet" s WHERE ${own}),
    stats AS (
      SELECT count(*)::float8 AS n, greatest(avg(length(d."search")), 1)::float8 AS avglen FROM docs d
    ),
    matches AS (
      SELECT d."id", d."occurredAt", u.lexeme, array_length(u.positions, 1)::float8 AS tf,
             length(d."search")::float8 AS len
      FROM docs d, q, unnest(ts_filter(setweight(d."search", 'A', q.terms), '{a}')) u
    ),
    df AS (SELECT lexeme, count(*)::float8 AS df FROM matches GROUP BY lexeme),
    ranked AS (
      SELECT m."id", sum(
               ln(1 + (stats.n - df.df + 0.5) / (df.df + 0.5))
               * m.tf * (${BM25.k1}::float8 + 1)
               / (m.tf + ${BM25.k1}::float8 * (1 - ${BM25.b}::float8 + ${BM25.b}::float8 * m.len / stats.avglen))
             )::float8 AS "rank"
      FROM matches m JOIN df USING (lexeme), stats
      GROUP BY m."id", m."occurredAt"
      ORDER BY "rank" DESC, m."occurredAt" DESC, m."id"
      LIMIT ${limit}
    )
    SELECT ${SNIPPET_COLUMNS}, r."rank"
    FROM ranked r JOIN "RecallSnippet" s ON s."id" = r."id"
    ORDER BY r."rank" DESC, s."occurredAt" DESC, s."id"`;
}

/** Why a search on a remote embedding route went without its vector side, once the budget refused the query's embedding. */
export const BUDGET_REASON = "the monthly token budget has no room to embed the query (spent, or held by model calls in flight)";

/** A vector search the store refused, failed or did not answer in time; `reason` is safe to show. */
class VectorStoreUnavailable extends EngramError {
  constructor(readonly reason: string) {
    super("VECTOR_STORE_UNAVAILABLE", `Vector search unavailable: ${reason}`);
  }
}

/**
 * The two retrievers' hits for a message, before fusion (the LoCoMo bench tunes fusion over
 * these), and the snippets they found: the vector hits are read back while the keyword
 * statement may still run, so no read-back waits for both sides.
 */
export async function retrieveHits(
  db: TenantDb,
  deps: Pick<RecallDeps, "embeddings" | "vectors" | "log">,
  input: SearchInput,
  pool: number,
) {
  const tenantId = db.$tenantId();
  const mode = input.mode ?? "HYBRID";
  let degraded: string | null = null;
  const vectorSide = async () => {
    if (mode === "KEYWORD") return [];
    try {
      const { embeddings, model } = await deps.embeddings.forTenant(tenantId);
      const vector = input.vector ?? (await embeddings.embedQuery(input.text));
      return await deps.vectors
        .query({ tenantId, model }, vector, { endUserId: input.endUserId, excludeConversationId: input.excludeConversationId }, pool)
        .catch((error: unknown) => {
          // The caller is told what happened, not the store's own words (its address, the tenant's collection).
          deps.log.warn("recall: the vector store could not be searched", { tenantId, error });
          throw new VectorStoreUnavailable(error instanceof TimedOut ? error.message : "the vector store refused or failed the search");
        });
    } catch (error) {
      if (mode === "VECTOR" || isModelCallLimit(error)) throw error;
      if (isBudgetExhausted(error)) {
        // Not an outage: the tenant's own limit, so no warning for every search until it is raised.
        degraded = `vector search unavailable: ${BUDGET_REASON}`;
        deps.log.info("recall: the monthly token budget refused the query's embedding; using keyword matches only", { tenantId });
        return [];
      }
      // In words written for callers (the store's, a model call's); the error itself is logged.
      degraded = `vector search unavailable: ${error instanceof VectorStoreUnavailable ? error.reason : publicReason(error, input.vector ? "failed unexpectedly" : "the query could not be embedded")}`;
      deps.log.warn("recall: vector search failed; using keyword matches only", { tenantId, error });
      return [];
    }
  };
  const vectorHits = vectorSide();
  const [vector, keyword, vectorRows] = await Promise.all([
    vectorHits,
    mode === "VECTOR" ? Promise.resolve([]) : keywordHits(db, input, pool),
    vectorHits.then((hits) => (hits.length ? readBack(db, input, hits.map((h) => h.id)) : [])),
  ]);
  const rows = new Map<string, ReadBack>([...vectorRows, ...keyword].map((s) => [s.id, s]));
  return { vector, keyword, rows, degraded: degraded as string | null };
}

/**
 * Seqs for the snippets stored without them: an instance of an Engram before migration 0013,
 * still running beside a newer one, writes its snippets' messages but not their seqs. One
 * statement, and none when every snippet has them.
 */
async function lookUpMissingSeqs(db: TenantDb, snippets: ReadBack[]) {
  const missing = snippets.filter((s) => s.messageSeqs.length !== s.messageIds.length);
  if (missing.length === 0) return;
  const messages = await db.message.findMany({ where: { id: { in: missing.flatMap((s) => s.messageIds) } }, select: { id: true, seq: true } });
  const seqOf = new Map(messages.map((m) => [m.id, m.seq]));
  for (const s of missing) s.messageSeqs = s.messageIds.map((id) => seqOf.get(id) ?? 0);
}

/**
 * The candidates for a message from one end user's other conversations: the nearest vectors
 * (Chroma), the full-text matches (PostgreSQL), fused by reciprocal rank with a boost for the
 * time the message names and at most RECALL.perConversation snippets per conversation among the
 * first RECALL.diversityWindow while the others wait (fusion.ts). Snippets are read back from the
 * database, so a vector whose snippet was forgotten is never returned. When vector search fails
 * (Chroma down), the keyword side still answers and `degraded` says why.
 */
export async function searchSnippets(
  db: TenantDb,
  deps: Pick<RecallDeps, "embeddings" | "vectors" | "log">,
  input: SearchInput,
): Promise<{ candidates: RecallCandidate[]; degraded: string | null; time: TimeHint | null }> {
  const pool = Math.max(input.k, RECALL.pool);
  const retrieved = retrieveHits(db, deps, input, pool);
  // Parsed while the retrievers are out (a millisecond or two of CPU).
  const time = resolveTimeHint(input.text, input.at ?? new Date());
  const { vector, keyword, rows: snippets, degraded } = await retrieved;
  if (snippets.size === 0) return { candidates: [], degraded, time };

  // The snippets that keys (facts' sentences) point to, when they were not found themselves.
  const targets = [...new Set([...snippets.values()].flatMap((s) => (s.keyOfId && !snippets.has(s.keyOfId) ? [s.keyOfId] : [])))];
  if (targets.length) for (const s of await readBack(db, input, targets)) snippets.set(s.id, s);
  await lookUpMissingSeqs(db, [...snippets.values()]);
  const fused = fuseHits(vector, keyword, withNeighbours(snippets), time, input.k, { ...RECALL, pool });
  const candidates = fused.map(({ id, ...scores }) => {
    const s = snippets.get(id)!;
    return {
      snippetId: s.id,
      kind: s.kind,
      text: s.text,
      conversationId: s.conversationId,
      messageIds: s.messageIds,
      messageSeqs: s.messageSeqs,
      occurredAt: s.occurredAt,
      indexedAt: s.indexedAt,
      ...scores,
      judgeScore: null,
      chosen: false,
    };
  });
  return { candidates, degraded, time };
}

/**
 * Each found turn with the found turns right before and after it in its conversation (its first
 * message follows the other's last), for fusion's neighbour weight.
 */
export function withNeighbours<S extends { id: string; kind: string; conversationId: string; messageSeqs: number[] }>(
  snippets: Map<string, S>,
): Map<string, S & { neighbourIds: string[] }> {
  const spans = new Map([...snippets.values()].map((s) => [s.id, s.kind === "TURN" ? seqSpan(s.messageSeqs) : null]));
  const byStart = new Map<string, string>();
  const byEnd = new Map<string, string>();
  for (const s of snippets.values()) {
    const span = spans.get(s.id);
    if (!span) continue;
    byStart.set(`${s.conversationId}:${span.first}`, s.id);
    byEnd.set(`${s.conversationId}:${span.last}`, s.id);
  }
  return new Map(
    [...snippets.values()].map((s) => {
      const span = spans.get(s.id);
      if (!span) return [s.id, { ...s, neighbourIds: [] }];
      const before = byEnd.get(`${s.conversationId}:${span.first - 1}`);
      const after = byStart.get(`${s.conversationId}:${span.last + 1}`);
      return [s.id, { ...s, neighbourIds: [before, after].filter((id): id is string => id !== undefined) }];
    }),
  );
}

/** The first and last seq of a turn's messages; a 0 stands for a message deleted since (migration 0013), and is left out. */
function seqSpan(seqs: number[]): { first: number; last: number } | null {
  const known = seqs.filter((seq) => seq > 0);
  return known.length ? { first: Math.min(...known), last: Math.max(...known) } : null;
}

/** Without the judge: the fused top 3 that are close enough, or strong keyword matches. */
function aboveFloor(candidates: RecallCandidate[], floor: number) {
  return candidates
    .filter((c) => (c.vectorScore ?? 0) >= floor || (c.vectorScore === null && c.keywordRank !== null && c.keywordRank <= RECALL.inject))
    .slice(0, RECALL.inject);
}

/**
 * The turns just before and after each TURN candidate in its conversation (their shared
 * messages), for the judge: a question's answer is often one turn away. One query.
 */
async function neighbouringTurns(db: TenantDb, candidates: RecallCandidate[]) {
  const around = new Map<string, { before: string | null; after: string | null }>();
  const turns = candidates.flatMap((c) => {
    const span = c.kind === "TURN" ? seqSpan(c.messageSeqs) : null;
    return span ? [{ c, ...span }] : [];
  });
  if (turns.length === 0) return around;
  const messages = await db.message.findMany({
    where: {
      private: false,
      // Kept raw but forgotten (forgetDeletesMessages off), or kept after a fact read from it was
      // deleted (deleteFact): never shown to the judge's model, as neither is recalled.
      forgottenAt: null,
      factsForgottenAt: null,
      role: { in: ["USER", "ASSISTANT"] },
      OR: turns.map(({ c, first, last }) => ({ conversationId: c.conversationId, seq: { in: [first - 2, first - 1, last + 1, last + 2] } })),
    },
    select: { conversationId: true, seq: true, role: true, content: true },
  });
  const at = new Map(messages.map((m) => [`${m.conversationId}:${m.seq}`, m]));
  const text = (conversationId: string, seqs: number[]) =>
    seqs
      .map((seq) => at.get(`${conversationId}:${seq}`))
      .filter((m) => m !== undefined)
      .map((m) => `${m.role.toLowerCase()}: ${m.content}`)
      .join(" / ") || null;
  for (const { c, first, last } of turns) {
    around.set(c.snippetId, { before: text(c.conversationId, [first - 2, first - 1]), after: text(c.conversationId, [last + 1, last + 2]) });
  }
  return around;
}

export type RecallForTurnInput = {
  endUserId: string;
  /** The conversation the message is in (left out of the search); null before its first turn. */
  conversationId: string | null;
  message: string;
  /** The per-turn gate's verdict; when not given, the keyword gate (keywords.ts) decides. */
  needsRecall?: boolean | null;
  /** When the message was said (default now), for the time it names. */
  at?: Date;
  /** The message's embedding, when the gate computed it: the search reuses it. */
  vector?: number[] | null;
  /** Why the message has no embedding (the local decision's encoder failed): the search is keyword-only and says so. */
  unembedded?: string | null;
};

/**
 * Recall for one turn: when the gate says the message needs earlier conversations, the 30 best
 * candidates from the user's other conversations are scored 0–3 by the re-rank judge, each shown
 * with the turns around it, and at most 3 scoring 2 or more are chosen (without a model: the
 * fused top 3 of the best 10 above the similarity floor). Each recall is published on `memoryRecall`. When the gate says no, nothing is
 * retrieved and nothing is embedded.
 */
export async function recallForTurn(db: TenantDb, deps: RecallDeps, input: RecallForTurnInput): Promise<RecallEvent | null> {
  const tenantId = db.$tenantId();
  const needed = input.needsRecall ?? needsRecallByKeywords(input.message);
  if (!needed) return null;
  const rerank = await chainFor(deps.models, tenantId, "rerank");
  const { candidates, degraded } = await searchSnippets(db, deps, {
    endUserId: input.endUserId,
    text: input.message,
    excludeConversationId: input.conversationId,
    // A judge chooses from a deeper list than the fused top 10 alone (bench/README.md).
    k: rerank ? RECALL.judgeCandidates : RECALL.candidates,
    at: input.at,
    vector: input.vector,
    // Not embedded a second time: the encoder just failed on this very message.
    mode: input.unembedded ? "KEYWORD" : "HYBRID",
  });

  let chosen: RecallCandidate[] = [];
  let chosenBy: RecallEvent["chosenBy"] = "FLOOR";
  let scores: RerankScores | null = null;
  let judgeDegraded: string | null = null;
  if (rerank && candidates.length) {
    try {
      const around = await neighbouringTurns(db, candidates);
      scores = await rerank.invoke({
        message: input.message,
        snippets: candidates.map((c) => ({ ...c, ...around.get(c.snippetId) })),
      });
    } catch (error) {
      if (isModelCallLimit(error)) throw error;
      // A reply must not wait on a broken judge: fall back to the similarity floor.
      judgeDegraded = judgeFailed(error);
      deps.log.warn("recall: the re-rank judge failed; using the similarity floor", {
        tenantId,
        ...(error instanceof OutputParserException ? unreadable(error) : { error: (error as Error).message }),
      });
    }
  }
  if (scores) {
    chosenBy = "JUDGE";
    candidates.forEach((c, i) => (c.judgeScore = scores[i]));
    chosen = candidates
      .filter((c) => (c.judgeScore ?? 0) >= RECALL.minJudgeScore)
      .sort((a, b) => (b.judgeScore ?? 0) - (a.judgeScore ?? 0) || b.fusedScore - a.fusedScore)
      .slice(0, RECALL.inject);
  } else if (candidates.length) {
    const { similarityFloor } = await deps.embeddings.forTenant(tenantId);
    chosen = aboveFloor(candidates, similarityFloor);
  }
  for (const c of chosen) c.chosen = true;

  const event: RecallEvent = {
    id: randomUUID(),
    endUserId: input.endUserId,
    conversationId: input.conversationId,
    message: input.message,
    at: new Date(),
    candidates,
    chosenBy,
    degraded: input.unembedded ?? degraded,
    judgeDegraded,
  };
  deps.pubsub.publish("memoryRecall", tenantId, event);
  return event;
}

/** The RECALL block of `context`: what was chosen, each with its date, and token counts. */
export function recallBlock(event: RecallEvent): ContextBlock | null {
  const chosen = event.candidates.filter((c) => c.chosen);
  if (chosen.length === 0) return null;
  const items = chosen.map((c) => {
    const text = `(${c.occurredAt.toISOString().slice(0, 10)}) ${quoteText(c.text)}`;
    return { id: c.snippetId, text, tokens: countTokens(text), score: c.judgeScore };
  });
  const text = items.map((i) => i.text).join("\n\n");
  return { kind: "RECALL", title: "From earlier conversations with this user", text, tokens: countTokens(text), items };
}

/** `degraded` of a context whose re-rank judge failed: a reason safe to show (a model call's short one, the budget's). */
const judgeFailed = (error: unknown) => `recall judge unavailable: ${publicReason(error, "it failed")}; the similarity floor chose instead`;

/** `degraded` of a context whose recall failed outright (the error itself is logged, not shown). */
const RECALL_FAILED = "recall unavailable: the context was assembled without it";

// While the encoder is down every context call falls back: one warning a minute says so (the
// process's one logger, taken from the first call's deps).
let fellBack: ((fields: object) => void) | undefined;
function warnFellBack(log: Logger, fields: Record<string, unknown>) {
  fellBack ??= sparingly(log, "warn", "recall: the local decision fell back to keywords (said at most once a minute)", 60_000);
  fellBack(fields);
}

/**
 * The producer `assembleContext` runs for recall. Any failure is logged and the context is
 * assembled without recall: a reply never waits on Chroma being up. What recall had to do
 * without (vector search, the local decision's embedding, recall itself) is passed on as
 * `degraded`, in the words of the `recall` query's.
 */
export function recallBlocks(
  db: TenantDb,
  deps: RecallDeps,
  options: {
    /**
     * Whether the message needs recall, and its embedding when that decision made one; `degraded`
     * when it could not embed the message (the search then skips the vector side).
     */
    decide?: (input: { message: string }) => Promise<{ needsRecall: boolean; vector?: number[] | null; degraded?: string | null; error?: string }>;
  } = {},
): ExtraBlocks {
  return async ({ conversationId, endUserId, message, settings }) => {
    try {
      if (!settings.recallOn) return { blocks: [], degraded: [] };
      const decision = await options.decide?.({ message });
      if (decision?.degraded) warnFellBack(deps.log, { tenantId: db.$tenantId(), reason: decision.degraded, error: decision.error });
      const event = await recallForTurn(db, deps, {
        endUserId,
        conversationId,
        message,
        needsRecall: decision?.needsRecall,
        vector: decision?.vector,
        unembedded: decision?.degraded,
      });
      const block = event && recallBlock(event);
      // The event repeats the decision's reason when the search ran: said once.
      const degraded = [...new Set([decision?.degraded, event?.degraded, event?.judgeDegraded].filter((reason): reason is string => Boolean(reason)))];
      return { blocks: block ? [block] : [], degraded };
    } catch (error) {
      // A spent request budget is the caller's to see; anything else is Chroma's or a model's problem.
      if (isModelCallLimit(error)) throw error;
      deps.log.warn("recall failed; the context is assembled without it", { tenantId: db.$tenantId(), conversationId, error });
      return { blocks: [], degraded: [RECALL_FAILED] };
    }
  };
}
