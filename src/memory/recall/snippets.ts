import type { TenantDb } from "../../db.ts";
import type { Deps } from "../../deps.ts";
import type { Message } from "../../generated/prisma/client.ts";
import { forgetSnippets } from "../forget.ts";

/** What indexing needs beside the tenant's client: the embedder and the vector store. */
export type SnippetDeps = Pick<Deps, "embeddings" | "vectors" | "log">;

// A long turn is cut for recall: its opening carries what it was about.
const SNIPPET_MAX_CHARS = 4_000;

const line = (m: Pick<Message, "role" | "content">) => `${m.role.toLowerCase()}: ${m.content.trim()}`;

/**
 * A user message with the replies that follow it, up to the next user message: the unit of
 * recall. Private steps, system and tool messages are not shared memory and are left out.
 */
export function groupTurns<M extends Pick<Message, "id" | "role" | "content" | "occurredAt" | "private">>(
  messages: M[],
): M[][] {
  const groups: M[][] = [];
  for (const m of messages) {
    if (m.private || (m.role !== "USER" && m.role !== "ASSISTANT")) continue;
    const current = groups.at(-1);
    if (m.role === "ASSISTANT" && current) current.push(m);
    else groups.push([m]);
  }
  return groups;
}

/** Creates the TURN snippets for messages firstSeq..lastSeq of a conversation; returns the ids still to embed. */
export async function createTurnSnippets(
  db: TenantDb,
  conversationId: string,
  range: { firstSeq: number; lastSeq: number },
): Promise<string[]> {
  const conversation = await db.conversation.findUnique({ where: { id: conversationId }, select: { endUserId: true } });
  if (!conversation) return [];
  const { ids } = await createSnippetsOfTurns(db, [{ conversationId, endUserId: conversation.endUserId, ...range }]);
  return ids;
}

export type TurnRange = { conversationId: string; endUserId: string; firstSeq: number; lastSeq: number };

/**
 * The TURN snippets of many turns at once (of any conversations): one read of their messages,
 * one of the snippets they already have, one insert. Returns the ids still to embed and the
 * messages read (by conversation, in seq order), which the caller's gate needs too.
 */
export async function createSnippetsOfTurns(db: TenantDb, turns: TurnRange[]) {
  if (turns.length === 0) return { ids: [] as string[], messages: [] as Message[] };
  const messages = await db.message.findMany({
    where: {
      private: false,
      OR: turns.map((t) => ({ conversationId: t.conversationId, seq: { gte: t.firstSeq, lte: t.lastSeq } })),
    },
    orderBy: [{ conversationId: "asc" }, { seq: "asc" }],
  });
  // Asked again (a retried job), messages that already have a snippet keep it; those snippets
  // are handed back while still without a vector, so the retry embeds them.
  const existing = await db.recallSnippet.findMany({
    where: {
      conversationId: { in: [...new Set(turns.map((t) => t.conversationId))] },
      kind: "TURN",
      messageIds: { hasSome: messages.map((m) => m.id) },
    },
    select: { id: true, messageIds: true, indexedAt: true },
  });
  const indexed = new Set(existing.flatMap((s) => s.messageIds));
  const waiting = existing.filter((s) => !s.indexedAt).map((s) => s.id);
  const endUserOf = new Map(turns.map((t) => [t.conversationId, t.endUserId]));
  const rows = turns.flatMap((turn) => {
    const ofTurn = messages.filter(
      (m) => m.conversationId === turn.conversationId && m.seq >= turn.firstSeq && m.seq <= turn.lastSeq && !indexed.has(m.id),
    );
    // A reply recorded on its own continues the turn its user message began.
    return groupTurns(ofTurn).map((group) => ({
      tenantId: db.$tenantId(),
      endUserId: endUserOf.get(turn.conversationId)!,
      conversationId: turn.conversationId,
      kind: "TURN" as const,
      text: group.map(line).join("\n").slice(0, SNIPPET_MAX_CHARS),
      messageIds: group.map((m) => m.id),
      occurredAt: group[0].occurredAt,
    }));
  });
  if (rows.length === 0) return { ids: waiting, messages };
  const created = await db.recallSnippet.createManyAndReturn({ data: rows, select: { id: true } });
  return { ids: [...waiting, ...created.map((row) => row.id)], messages };
}

/**
 * Keeps one SUMMARY snippet per conversation in step with its accepted summary; returns its id
 * when it changed (to be indexed again), else null.
 */
export async function syncSummarySnippet(db: TenantDb, conversationId: string): Promise<string | null> {
  const conversation = await db.conversation.findUnique({
    where: { id: conversationId },
    select: { endUserId: true, summary: true, summaryThroughSeq: true },
  });
  if (!conversation?.summary) return null;
  const covered = await db.message.findFirst({
    where: { conversationId, seq: conversation.summaryThroughSeq },
    select: { occurredAt: true },
  });
  const existing = await db.recallSnippet.findFirst({ where: { conversationId, kind: "SUMMARY" } });
  if (existing?.text === conversation.summary) return null;
  const data = {
    text: conversation.summary.slice(0, SNIPPET_MAX_CHARS),
    occurredAt: covered?.occurredAt ?? new Date(),
    indexedAt: null,
  };
  if (existing) {
    await db.recallSnippet.update({ where: { id: existing.id }, data });
    return existing.id;
  }
  const created = await db.recallSnippet.create({
    data: { ...data, tenantId: db.$tenantId(), endUserId: conversation.endUserId, conversationId, kind: "SUMMARY", messageIds: [] },
  });
  return created.id;
}

/**
 * Keeps one FACT key per fact of the user that came from a message: the fact's sentence as an
 * extra recall key for the TURN snippet holding that message (a hit on the key is credited to the
 * turn, see fusion.ts). Creates missing keys, re-points or rewrites changed ones and deletes those
 * whose fact or turn is gone; returns the ids to index.
 */
export async function syncFactKeys(db: TenantDb, deps: Pick<Deps, "vectors">, endUserId: string): Promise<string[]> {
  const tenantId = db.$tenantId();
  const [facts, keys] = await Promise.all([
    db.fact.findMany({ where: { endUserId, sourceMessageId: { not: null } }, select: { id: true, text: true, sourceMessageId: true } }),
    db.recallSnippet.findMany({ where: { endUserId, kind: "FACT" }, select: { id: true, factId: true, keyOfId: true, text: true } }),
  ]);
  const sources = facts.map((f) => f.sourceMessageId!);
  const turns = sources.length
    ? await db.recallSnippet.findMany({
        where: { endUserId, kind: "TURN", messageIds: { hasSome: sources } },
        select: { id: true, conversationId: true, occurredAt: true, messageIds: true },
      })
    : [];
  const turnOf = new Map(turns.flatMap((t) => t.messageIds.map((m) => [m, t] as const)));
  const keyOf = new Map(keys.map((k) => [k.factId, k]));
  const wanted = new Set<string>();
  const toIndex: string[] = [];
  for (const fact of facts) {
    const turn = turnOf.get(fact.sourceMessageId!);
    if (!turn) continue;
    const key = keyOf.get(fact.id);
    const data = { text: fact.text, keyOfId: turn.id, conversationId: turn.conversationId, occurredAt: turn.occurredAt };
    if (!key) {
      const created = await db.recallSnippet.create({
        data: { ...data, tenantId, endUserId, kind: "FACT", factId: fact.id, messageIds: [] },
        select: { id: true },
      });
      toIndex.push(created.id);
    } else {
      wanted.add(key.id);
      if (key.text !== fact.text || key.keyOfId !== turn.id) {
        await db.recallSnippet.update({ where: { id: key.id }, data: { ...data, indexedAt: null } });
        toIndex.push(key.id);
      }
    }
  }
  await forgetSnippets(db, deps, keys.filter((k) => !wanted.has(k.id)).map((k) => k.id));
  return toIndex;
}

/**
 * Embeds snippets and upserts their vectors, then marks them indexed. Idempotent: running it
 * twice re-upserts the same vectors. A snippet forgotten meanwhile leaves no vector behind.
 */
export async function indexSnippets(db: TenantDb, deps: SnippetDeps, snippetIds: string[]) {
  const tenantId = db.$tenantId();
  const snippets = await db.recallSnippet.findMany({ where: { id: { in: snippetIds } } });
  if (snippets.length === 0) return { indexed: 0 };
  const { embeddings, model } = await deps.embeddings.forTenant(tenantId);
  const vectors = await embeddings.embedDocuments(snippets.map((s) => s.text));
  await deps.vectors.upsert(
    { tenantId, model },
    snippets.map((s, i) => ({
      id: s.id,
      vector: vectors[i],
      endUserId: s.endUserId,
      conversationId: s.conversationId,
      kind: s.kind,
      occurredAt: s.occurredAt,
    })),
  );
  const { count } = await db.recallSnippet.updateMany({
    where: { id: { in: snippets.map((s) => s.id) } },
    data: { indexedAt: new Date(), embeddingModel: model },
  });
  if (count < snippets.length) {
    // Forgotten between the read and the upsert: take their vectors back out.
    const left = new Set((await db.recallSnippet.findMany({ where: { id: { in: snippetIds } }, select: { id: true } })).map((s) => s.id));
    await deps.vectors.delete(tenantId, { ids: snippets.filter((s) => !left.has(s.id)).map((s) => s.id) });
  }
  return { indexed: count };
}

/**
 * Snippets a crash (between the database and Chroma) or an outage left without a vector, or
 * embedded with another model than the tenant's current one; oldest first.
 */
export async function snippetsToReindex(db: TenantDb, model: string, options: { olderThan: Date; limit: number }) {
  const rows = await db.recallSnippet.findMany({
    where: {
      createdAt: { lt: options.olderThan },
      OR: [{ indexedAt: null }, { embeddingModel: { not: model } }, { embeddingModel: null }],
    },
    orderBy: { createdAt: "asc" },
    take: options.limit,
    select: { id: true },
  });
  return rows.map((r) => r.id);
}


export type RecallIndexStatus = { pending: number; oldestPendingAt: Date | null };

/**
 * What of an end user's conversations is not searchable yet: turns still in the outbox
 * (follow-ups not queued) or queued but with messages past the newest snippet of their
 * conversation (the index job has not made their snippets), plus snippets without a vector.
 * Zero pending means every recorded message can be recalled.
 */
export async function recallIndexStatus(db: TenantDb, endUserId: string): Promise<RecallIndexStatus> {
  const tenantId = db.$tenantId();
  const [turns] = await db.$queryRaw<{ n: number; oldest: Date | null }[]>`
    WITH convs AS (
      SELECT c."id" FROM "Conversation" c WHERE c."tenantId" = ${tenantId} AND c."endUserId" = ${endUserId}
    ),
    covered AS (
      SELECT s."conversationId", max(m."seq") AS seq
      FROM "RecallSnippet" s JOIN "Message" m ON m."id" = s."messageIds"[array_length(s."messageIds", 1)]
      WHERE s."tenantId" = ${tenantId} AND s."endUserId" = ${endUserId} AND s."kind" = 'TURN'
      GROUP BY s."conversationId"
    )
    SELECT count(*)::int AS n, min(t."createdAt") AS oldest
    FROM "Turn" t JOIN convs ON convs."id" = t."conversationId"
    LEFT JOIN covered cv ON cv."conversationId" = t."conversationId"
    WHERE t."tenantId" = ${tenantId} AND (
      t."followUpsQueuedAt" IS NULL OR EXISTS (
        SELECT 1 FROM "Message" m
        WHERE m."conversationId" = t."conversationId" AND m."seq" BETWEEN t."firstSeq" AND t."lastSeq"
          AND NOT m."private" AND m."role" IN ('USER', 'ASSISTANT') AND m."seq" > coalesce(cv.seq, 0)
      )
    )`;
  const snippets = await db.recallSnippet.aggregate({
    where: { endUserId, indexedAt: null },
    _count: { _all: true },
    _min: { createdAt: true },
  });
  const oldest = [turns?.oldest ?? null, snippets._min.createdAt].filter((d): d is Date => d != null);
  return {
    pending: (turns?.n ?? 0) + snippets._count._all,
    oldestPendingAt: oldest.length ? new Date(Math.min(...oldest.map((d) => d.getTime()))) : null,
  };
}
