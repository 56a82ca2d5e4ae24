import { randomUUID } from "node:crypto";
import { OutputParserException } from "@langchain/core/output_parsers";
import { chainFor } from "../../chains/registry.ts";
import type { RerankScores } from "../../chains/rerank.ts";
import type { TenantDb } from "../../db.ts";
import { Prisma } from "../../generated/prisma/client.ts";
import type { ModelProvider } from "../../models/provider.ts";
import type { PubSub, RecallCandidate, RecallEvent } from "../../pubsub.ts";
import type { ContextBlock, ExtraBlocks } from "../context.ts";
import { needsRecallByKeywords } from "../gate/keywords.ts";
import type { SnippetDeps } from "./snippets.ts";
import { countTokens } from "../tokens.ts";

export type RecallDeps = SnippetDeps & { models: ModelProvider; pubsub: PubSub };


export type RecallMode = "HYBRID" | "VECTOR" | "KEYWORD";
export type { RecallCandidate, RecallEvent };

/**
 * The issue's numbers: 10 candidates, at most 3 injected, judge score 2 or more. The fusion's
 * constants were chosen on LoCoMo (bench/README.md): a small k (5, not the usual 60) lets the
 * first ranks of each retriever count, and the BM25 side weighs 1.3 against the offline
 * encoder's 1, which puts 5 more points of questions' evidence in the top 3 at the same top 10.
 */
export const RECALL = { candidates: 10, inject: 3, minJudgeScore: 2, rrfK: 5, keywordWeight: 1.3 } as const;

export type SearchInput = {
  endUserId: string;
  text: string;
  excludeConversationId?: string | null;
  k: number;
  mode?: RecallMode;
  /** The text's embedding by the tenant's embedder, when the caller has it already (no second embedding). */
  vector?: number[] | null;
};

/** Okapi BM25's usual constants: term-frequency saturation and document-length normalisation. */
const BM25 = { k1: 1.2, b: 0.75 } as const;

/**
 * Full-text hits ranked by Okapi BM25 over the end user's own snippets: any of the message's
 * lexemes may match (an OR, English stemming and stop words), each weighted by its inverse
 * document frequency among that user's snippets, so the words every snippet shares (the user's
 * and the assistant's names, "today") count for almost nothing and a rare one for a lot.
 * PostgreSQL's ts_rank_cd has no such weight, and it was what held the keyword side back on
 * LoCoMo (bench/README.md). The statistics are computed per query from the user's tsvectors.
 */
async function keywordHits(db: TenantDb, input: SearchInput, limit: number) {
  const tenantId = db.$tenantId();
  return db.$queryRaw<{ id: string; rank: number }[]>`
    WITH q AS (SELECT tsvector_to_array(to_tsvector('english', ${input.text})) AS terms),
    docs AS (
      SELECT s."id", s."search", s."occurredAt"
      FROM "RecallSnippet" s
      WHERE s."tenantId" = ${tenantId}
        AND s."endUserId" = ${input.endUserId}
        ${input.excludeConversationId ? Prisma.sql`AND s."conversationId" <> ${input.excludeConversationId}` : Prisma.empty}
    ),
    stats AS (
      SELECT count(*)::float8 AS n, greatest(avg(length(d."search")), 1)::float8 AS avglen FROM docs d
    ),
    matches AS (
      SELECT d."id", d."occurredAt", u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS tf,
             length(d."search")::float8 AS len
      FROM docs d, q, unnest(d."search") u
      WHERE u.lexeme = ANY (q.terms)
    ),
    df AS (SELECT lexeme, count(*)::float8 AS df FROM matches GROUP BY lexeme)
    SELECT m."id", sum(
             ln(1 + (stats.n - df.df + 0.5) / (df.df + 0.5))
             * m.tf * (${BM25.k1}::float8 + 1)
             / (m.tf + ${BM25.k1}::float8 * (1 - ${BM25.b}::float8 + ${BM25.b}::float8 * m.len / stats.avglen))
           )::float8 AS "rank"
    FROM matches m JOIN df USING (lexeme), stats
    GROUP BY m."id", m."occurredAt"
    ORDER BY "rank" DESC, m."occurredAt" DESC
    LIMIT ${limit}`;
}

/**
 * The candidates for a message from one end user's other conversations: the nearest vectors
 * (Chroma), the full-text matches (PostgreSQL), fused by reciprocal rank. Snippets are read back
 * from the database, so a vector whose snippet was forgotten is never returned. When vector
 * search fails (Chroma down), the keyword side still answers and `degraded` says why.
 */
export async function searchSnippets(
  db: TenantDb,
  deps: Pick<RecallDeps, "embeddings" | "vectors" | "log">,
  input: SearchInput,
): Promise<{ candidates: RecallCandidate[]; degraded: string | null }> {
  const tenantId = db.$tenantId();
  const mode = input.mode ?? "HYBRID";
  // Each retriever brings its 10 best (or k); a deeper pool did not help on LoCoMo (bench/README.md).
  const pool = Math.max(input.k, RECALL.candidates);
  let degraded: string | null = null;

  const vectorSide = async () => {
    if (mode === "KEYWORD") return [];
    try {
      const { embeddings, model } = await deps.embeddings.forTenant(tenantId);
      const vector = input.vector ?? (await embeddings.embedQuery(input.text));
      return await deps.vectors.query(
        { tenantId, model },
        vector,
        { endUserId: input.endUserId, excludeConversationId: input.excludeConversationId },
        pool,
      );
    } catch (error) {
      if (mode === "VECTOR") throw error;
      degraded = `vector search unavailable: ${(error as Error).message}`;
      deps.log.warn("recall: vector search failed; using keyword matches only", { tenantId, error });
      return [];
    }
  };
  const [vector, keyword] = await Promise.all([
    vectorSide(),
    mode === "VECTOR" ? Promise.resolve([]) : keywordHits(db, input, pool),
  ]);

  const scores = new Map<string, Pick<RecallCandidate, "vectorScore" | "vectorRank" | "keywordScore" | "keywordRank" | "fusedScore">>();
  const entry = (id: string) => {
    let s = scores.get(id);
    if (!s) scores.set(id, (s = { vectorScore: null, vectorRank: null, keywordScore: null, keywordRank: null, fusedScore: 0 }));
    return s;
  };
  vector.forEach((hit, i) => {
    const s = entry(hit.id);
    s.vectorScore = hit.similarity;
    s.vectorRank = i + 1;
    s.fusedScore += 1 / (RECALL.rrfK + i + 1);
  });
  keyword.forEach((hit, i) => {
    const s = entry(hit.id);
    s.keywordScore = hit.rank;
    s.keywordRank = i + 1;
    s.fusedScore += RECALL.keywordWeight / (RECALL.rrfK + i + 1);
  });
  if (scores.size === 0) return { candidates: [], degraded };

  const snippets = await db.recallSnippet.findMany({
    where: {
      id: { in: [...scores.keys()] },
      endUserId: input.endUserId,
      ...(input.excludeConversationId ? { conversationId: { not: input.excludeConversationId } } : {}),
    },
    select: { id: true, kind: true, text: true, conversationId: true, messageIds: true, occurredAt: true, indexedAt: true },
  });
  const messageIds = snippets.flatMap((s) => s.messageIds);
  const seqOf = new Map(
    messageIds.length
      ? (await db.message.findMany({ where: { id: { in: messageIds } }, select: { id: true, seq: true } })).map((m) => [m.id, m.seq])
      : [],
  );
  const candidates = snippets
    .map((s) => ({
      snippetId: s.id,
      kind: s.kind,
      text: s.text,
      conversationId: s.conversationId,
      messageIds: s.messageIds,
      messageSeqs: s.messageIds.map((id) => seqOf.get(id) ?? 0),
      occurredAt: s.occurredAt,
      indexedAt: s.indexedAt,
      ...scores.get(s.id)!,
      judgeScore: null,
      chosen: false,
    }))
    .sort((a, b) => b.fusedScore - a.fusedScore || (b.vectorScore ?? 0) - (a.vectorScore ?? 0))
    .slice(0, input.k);
  return { candidates, degraded };
}

/** Without the judge: the fused top 3 that are close enough, or strong keyword matches. */
function aboveFloor(candidates: RecallCandidate[], floor: number) {
  return candidates
    .filter((c) => (c.vectorScore ?? 0) >= floor || (c.vectorScore === null && c.keywordRank !== null && c.keywordRank <= RECALL.inject))
    .slice(0, RECALL.inject);
}

export type RecallForTurnInput = {
  endUserId: string;
  /** The conversation the message is in (left out of the search); null before its first turn. */
  conversationId: string | null;
  message: string;
  /** The per-turn gate's verdict; when not given, the keyword gate (keywords.ts) decides. */
  needsRecall?: boolean | null;
  /** The message's embedding, when the gate computed it: the search reuses it. */
  vector?: number[] | null;
};

/**
 * Recall for one turn: when the gate says the message needs earlier conversations, the 10 best
 * candidates from the user's other conversations are scored 0–3 by the re-rank judge and at
 * most 3 scoring 2 or more are chosen (without a model: the fused top 3 above the similarity
 * floor). Each recall is published on `memoryRecall`. When the gate says no, nothing is
 * retrieved and nothing is embedded.
 */
export async function recallForTurn(db: TenantDb, deps: RecallDeps, input: RecallForTurnInput): Promise<RecallEvent | null> {
  const tenantId = db.$tenantId();
  const needed = input.needsRecall ?? needsRecallByKeywords(input.message);
  if (!needed) return null;
  const { candidates, degraded } = await searchSnippets(db, deps, {
    endUserId: input.endUserId,
    text: input.message,
    excludeConversationId: input.conversationId,
    k: RECALL.candidates,
    vector: input.vector,
  });

  let chosen: RecallCandidate[] = [];
  let chosenBy: RecallEvent["chosenBy"] = "FLOOR";
  const rerank = candidates.length ? await chainFor(deps.models, tenantId, "rerank") : null;
  let scores: RerankScores | null = null;
  if (rerank) {
    try {
      scores = await rerank.invoke({ message: input.message, snippets: candidates });
    } catch (error) {
      // A reply must not wait on a broken judge: fall back to the similarity floor.
      deps.log.warn("recall: the re-rank judge failed; using the similarity floor", {
        tenantId,
        error: (error as Error).message,
        ...(error instanceof OutputParserException ? { answer: String(error.llmOutput ?? "").slice(0, 500) } : {}),
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
    degraded,
  };
  deps.pubsub.publish("memoryRecall", tenantId, event);
  return event;
}

/** The RECALL block of `context`: what was chosen, each with its date, and token counts. */
export function recallBlock(event: RecallEvent): ContextBlock | null {
  const chosen = event.candidates.filter((c) => c.chosen);
  if (chosen.length === 0) return null;
  const items = chosen.map((c) => {
    const text = `(${c.occurredAt.toISOString().slice(0, 10)}) ${c.text.trim()}`;
    return { id: c.snippetId, text, tokens: countTokens(text), score: c.judgeScore };
  });
  const text = items.map((i) => i.text).join("\n\n");
  return { kind: "RECALL", title: "From earlier conversations with this user", text, tokens: countTokens(text), items };
}

/**
 * The producer `assembleContext` runs for recall. Any failure is logged and the context is
 * assembled without recall: a reply never waits on Chroma being up.
 */
export function recallBlocks(
  db: TenantDb,
  deps: RecallDeps,
  options: {
    /** Whether the message needs recall, and its embedding when that decision made one. */
    decide?: (input: { message: string }) => Promise<{ needsRecall: boolean; vector?: number[] | null }>;
  } = {},
): ExtraBlocks {
  return async ({ conversationId, endUserId, message, settings }) => {
    try {
      if (!settings.recallOn) return [];
      const decision = await options.decide?.({ message });
      const event = await recallForTurn(db, deps, {
        endUserId,
        conversationId,
        message,
        needsRecall: decision?.needsRecall,
        vector: decision?.vector,
      });
      const block = event && recallBlock(event);
      return block ? [block] : [];
    } catch (error) {
      deps.log.warn("recall failed; the context is assembled without it", { tenantId: db.$tenantId(), conversationId, error });
      return [];
    }
  };
}
