import type { Db, TenantDb } from "../../db.ts";
import { forTenant } from "../../db.ts";
import type { EmbeddingsProvider } from "../../embeddings/index.ts";
import { Prisma, type Message } from "../../generated/prisma/client.ts";
import type { Logger } from "../../log.ts";
import type { VectorStore } from "../../vectors/index.ts";
import type { RecallForgetter } from "../facts/facts.ts";
import { matchesAnyPhrase } from "../text-search.ts";

/** What indexing and forgetting need: the database, the embedder and the vector store. */
export type SnippetDeps = { db: Db; embeddings: EmbeddingsProvider; vectors: VectorStore; log: Logger };

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

/** Creates the TURN snippets for messages firstSeq..lastSeq of a conversation; returns their ids. */
export async function createTurnSnippets(
  db: TenantDb,
  conversationId: string,
  range: { firstSeq: number; lastSeq: number },
): Promise<string[]> {
  const conversation = await db.conversation.findUnique({ where: { id: conversationId }, select: { endUserId: true } });
  if (!conversation) return [];
  const messages = await db.message.findMany({
    where: { conversationId, private: false, seq: { gte: range.firstSeq, lte: range.lastSeq } },
    orderBy: { seq: "asc" },
  });
  // Asked again (a client's retry after a crash), messages that already have a snippet keep it.
  const indexed = new Set(
    (
      await db.recallSnippet.findMany({
        where: { conversationId, kind: "TURN", messageIds: { hasSome: messages.map((m) => m.id) } },
        select: { messageIds: true },
      })
    ).flatMap((s) => s.messageIds),
  );
  // A reply recorded on its own continues the turn its user message began.
  const groups = groupTurns(messages.filter((m) => !indexed.has(m.id)));
  const rows = groups.map((group) => ({
    tenantId: db.$tenantId(),
    endUserId: conversation.endUserId,
    conversationId,
    kind: "TURN" as const,
    text: group.map(line).join("\n").slice(0, SNIPPET_MAX_CHARS),
    messageIds: group.map((m) => m.id),
    occurredAt: group[0].occurredAt,
  }));
  if (rows.length === 0) return [];
  const created = await db.recallSnippet.createManyAndReturn({ data: rows, select: { id: true } });
  return created.map((row) => row.id);
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
export async function syncFactKeys(deps: Pick<SnippetDeps, "db" | "vectors">, tenantId: string, endUserId: string): Promise<string[]> {
  const db = forTenant(deps.db, tenantId);
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
  await forgetSnippets(deps, tenantId, keys.filter((k) => !wanted.has(k.id)).map((k) => k.id));
  return toIndex;
}

/**
 * Embeds snippets and upserts their vectors, then marks them indexed. Idempotent: running it
 * twice re-upserts the same vectors. A snippet forgotten meanwhile leaves no vector behind.
 */
export async function indexSnippets(deps: SnippetDeps, tenantId: string, snippetIds: string[]) {
  const db = forTenant(deps.db, tenantId);
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

/** Deletes snippets, their vectors first (a failure leaves the rows, and the call can be repeated). */
export async function forgetSnippets(deps: Pick<SnippetDeps, "db" | "vectors">, tenantId: string, ids: string[]) {
  if (ids.length === 0) return { deleted: 0 };
  // A turn's keys (its facts' sentences) go with it: their rows cascade, their vectors would not.
  const keys = await forTenant(deps.db, tenantId).recallSnippet.findMany({ where: { keyOfId: { in: ids } }, select: { id: true } });
  const snippetIds = [...ids, ...keys.map((k) => k.id)];
  await deps.vectors.delete(tenantId, { ids: snippetIds });
  const { count } = await forTenant(deps.db, tenantId).recallSnippet.deleteMany({ where: { id: { in: snippetIds } } });
  // Again: an index job that read a row before it went may have upserted its vector meanwhile.
  await deps.vectors.delete(tenantId, { ids: snippetIds });
  return { deleted: count };
}

/** "Forget everything" for recall: every snippet and vector of one end user. */
export async function forgetUserRecall(deps: Pick<SnippetDeps, "db" | "vectors">, tenantId: string, endUserId: string) {
  await deps.vectors.delete(tenantId, { endUserId });
  const { count } = await forTenant(deps.db, tenantId).recallSnippet.deleteMany({ where: { endUserId } });
  await deps.vectors.delete(tenantId, { endUserId }); // see forgetSnippets
  return { deleted: count };
}

/** Before a conversation is deleted (its rows cascade, its vectors would not). */
export async function forgetConversationRecall(
  deps: Pick<SnippetDeps, "db" | "vectors">,
  tenantId: string,
  conversationId: string,
) {
  await deps.vectors.delete(tenantId, { conversationId });
  const { count } = await forTenant(deps.db, tenantId).recallSnippet.deleteMany({ where: { conversationId } });
  await deps.vectors.delete(tenantId, { conversationId }); // see forgetSnippets
  return { deleted: count };
}

/** The snippets of a user that mention any of the phrases they asked to forget. */
export async function forgetMatchingRecall(
  deps: Pick<SnippetDeps, "db" | "vectors">,
  tenantId: string,
  endUserId: string,
  phrases: string[],
) {
  if (phrases.length === 0) return { deleted: 0 };
  const rows = await deps.db.$queryRaw<{ id: string }[]>`
    SELECT s."id" FROM "RecallSnippet" s
    WHERE s."tenantId" = ${tenantId} AND s."endUserId" = ${endUserId}
      AND ${matchesAnyPhrase(Prisma.sql`s."search"`, phrases)}`;
  return forgetSnippets(deps, tenantId, rows.map((r) => r.id));
}

/** How the facts area forgets recall data along with facts. */
export function recallForgetter(deps: Pick<SnippetDeps, "db" | "vectors">): RecallForgetter {
  return {
    forgetUser: async (tenantId, endUserId) => ({ snippets: (await forgetUserRecall(deps, tenantId, endUserId)).deleted }),
    forgetMatching: async (tenantId, endUserId, phrases) => ({
      snippets: (await forgetMatchingRecall(deps, tenantId, endUserId, phrases)).deleted,
    }),
    forgetConversation: async (tenantId, conversationId) => ({
      snippets: (await forgetConversationRecall(deps, tenantId, conversationId)).deleted,
    }),
    forgetMessages: async (tenantId, messageIds) => {
      const rows = await forTenant(deps.db, tenantId).recallSnippet.findMany({
        where: { messageIds: { hasSome: messageIds } },
        select: { id: true },
      });
      return { snippets: (await forgetSnippets(deps, tenantId, rows.map((r) => r.id))).deleted };
    },
  };
}
