import { appNow, type TenantDb } from "../../db.ts";
import type { Deps } from "../../deps.ts";
import { Prisma, type Message } from "../../generated/prisma/client.ts";
import { liveMessages } from "../conversations/live-messages.ts";
import { forgetSnippets, type VectorDeps } from "../forget.ts";

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
  const { rows, waiting: unindexed } = await planSnippetsOfTurns(db, [{ conversationId, endUserId: conversation.endUserId, ...range }]);
  const waiting = unindexed.map((s) => s.id);
  if (rows.length === 0) return waiting;
  const created = await db.$queryRaw<{ id: string }[]>`
    WITH ${insertTurnSnippets(db.$tenantId(), rows.map(({ turn: _, ...row }) => row))}
    SELECT "id" FROM "inserted"`;
  return [...waiting, ...created.map((row) => row.id)];
}

/** A planned TURN snippet, as planSnippetsOfTurns makes it; `turnId` when a caller's statement narrows the rows by it. */
export type SnippetRow = Omit<Awaited<ReturnType<typeof planSnippetsOfTurns>>["rows"][number], "turn"> & { turnId?: string };

/**
 * The insert of planned TURN snippets, as the common table expressions `live` and `inserted`
 * (the new rows' ids) of one statement, which a caller may extend (`and` narrows the rows, by
 * `r."turnId"` say; `live` also holds those of `alsoLocked` still there, for the caller's own
 * writes from messages). A row goes in only while all of its messages are still there, not
 * forgotten and without a deleted fact (deleteFact deletes the snippets of the message its fact
 * came from), and the statement locks those messages (FOR SHARE, in id order, as the forgets lock
 * them) until its transaction ends: a forget that marks or deletes them after the plan read them
 * either commits first, and the row is left out, or waits for the insert, and then finds the
 * snippet when it looks again (src/memory/forget.ts). Without that, a turn's snippet planned
 * before a forget and written after it would bring back what was forgotten.
 */
export function insertTurnSnippets(
  tenantId: string,
  rows: SnippetRow[],
  and: Prisma.Sql = Prisma.empty,
  alsoLocked: string[] = [],
): Prisma.Sql {
  // One lock of all the statement's messages, in id order: a second CTE locking more of them
  // could take them out of the order the forgets take them in, and deadlock with one.
  const messageIds = [...rows.flatMap((r) => r.messageIds), ...alsoLocked];
  return Prisma.sql`${liveMessages("live", tenantId, messageIds)}, "inserted" AS (
      INSERT INTO "RecallSnippet" ("id", "tenantId", "endUserId", "conversationId", "kind", "text", "messageIds", "messageSeqs", "occurredAt", "createdAt")
      SELECT gen_random_uuid()::text, ${tenantId}, r."endUserId", r."conversationId", r."kind"::"SnippetKind", r."text", r."messageIds", r."messageSeqs", r."occurredAt", ${appNow()}
      FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb)
        AS r("turnId" text, "endUserId" text, "conversationId" text, "kind" text, "text" text, "messageIds" text[], "messageSeqs" int[], "occurredAt" timestamp(3))
      WHERE r."messageIds" <@ (SELECT coalesce(array_agg("id"), '{}') FROM "live" WHERE NOT "factsForgotten") ${and}
      RETURNING "id"
    )`;
}

export type TurnRange = { conversationId: string; endUserId: string; firstSeq: number; lastSeq: number };

/**
 * The TURN snippets of many turns at once (of any conversations), not yet written: one read of
 * their messages, one of the snippets they already have. Returns the rows to insert (each with
 * the index of its turn), the existing snippets still to embed, and the messages read (by
 * conversation, in seq order), which the caller's gate needs too.
 */
export async function planSnippetsOfTurns(db: TenantDb, turns: TurnRange[]) {
  if (turns.length === 0) return { rows: [], waiting: [] as { id: string; messageIds: string[] }[], messages: [] as Message[] };
  const messages = await db.message.findMany({
    where: {
      private: false,
      // Forgotten while the tenant keeps raw messages: a snippet made from one now (a turn's index
      // job that runs after its forget request's) would bring back what was forgotten.
      forgottenAt: null,
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
  const waiting = existing.filter((s) => !s.indexedAt).map(({ id, messageIds }) => ({ id, messageIds }));
  const rows = turns.flatMap((turn, index) => {
    const ofTurn = messages.filter(
      (m) => m.conversationId === turn.conversationId && m.seq >= turn.firstSeq && m.seq <= turn.lastSeq && !indexed.has(m.id),
    );
    // A reply recorded on its own continues the turn its user message began. A turn holding a
    // message a fact was deleted from gets no snippet: deleteFact deleted it (forget.ts).
    return groupTurns(ofTurn).filter((group) => group.every((m) => m.factsForgottenAt === null)).map((group) => ({
      turn: index,
      endUserId: turn.endUserId,
      conversationId: turn.conversationId,
      kind: "TURN" as const,
      // A cut through a surrogate pair drops its lone half: the round sends the text as jsonb, which refuses one.
      text: group.map(line).join("\n").slice(0, SNIPPET_MAX_CHARS).replace(/[\uD800-\uDBFF]$/, ""),
      messageIds: group.map((m) => m.id),
      messageSeqs: group.map((m) => m.seq),
      occurredAt: group[0].occurredAt,
    }));
  });
  return { rows, waiting, messages };
}

/**
 * Keeps a conversation's SUMMARY keys in step with its accepted summary: one key per sentence,
 * pointing (keyOfId) to the covered turn that shares the most distinctive words with it, so a hit
 * on the summary is credited to a turn the summary covers, as a fact's sentence is to its source
 * turn (fusion.ts). A sentence no covered turn shares a word with stays a SUMMARY snippet of its
 * own. Unchanged keys are left alone; returns the ids to index.
 */
export async function syncSummaryKeys(db: TenantDb, deps: VectorDeps, conversationId: string): Promise<string[]> {
  const conversation = await db.conversation.findUnique({
    where: { id: conversationId },
    select: { endUserId: true, summary: true, summaryThroughSeq: true },
  });
  if (!conversation?.summary) return [];
  const [covered, turns, existing] = await Promise.all([
    db.message.findMany({
      where: { conversationId, seq: { lte: conversation.summaryThroughSeq } },
      select: { id: true, occurredAt: true },
      orderBy: { seq: "asc" },
    }),
    db.recallSnippet.findMany({
      where: { conversationId, kind: "TURN" },
      select: { id: true, text: true, messageIds: true, occurredAt: true },
      orderBy: { occurredAt: "asc" },
    }),
    db.recallSnippet.findMany({ where: { conversationId, kind: "SUMMARY" }, select: { id: true, text: true, keyOfId: true } }),
  ]);
  const coveredIds = new Set(covered.map((m) => m.id));
  const coveredTurns = turns.filter((t) => t.messageIds.length && coveredIds.has(t.messageIds[0]));
  const fallbackAt = covered.at(-1)?.occurredAt ?? new Date();
  const wanted = summarySentences(conversation.summary.slice(0, SNIPPET_MAX_CHARS)).map((text) => {
    const turn = closestTurn(text, coveredTurns);
    return { text, keyOfId: turn?.id ?? null, occurredAt: turn?.occurredAt ?? fallbackAt };
  });
  const same = (a: { text: string; keyOfId: string | null }) => `${a.keyOfId ?? ""}|${a.text}`;
  const have = new Set(existing.map(same));
  if (existing.length === wanted.length && wanted.every((w) => have.has(same(w)))) return [];
  await forgetSnippets(db, deps, existing.map((k) => k.id));
  // Only while the summary is still the one read, its row locked for the statement: a forget that
  // clears it meanwhile either commits first, and nothing is written, or waits, and then sweeps
  // the conversation's SUMMARY keys again (src/memory/forget.ts).
  const tenantId = db.$tenantId();
  const created = await db.$queryRaw<{ id: string }[]>`
    WITH "current" AS (
      SELECT c."id" FROM "Conversation" c
      WHERE c."tenantId" = ${tenantId} AND c."id" = ${conversationId} AND c."summary" = ${conversation.summary}
      FOR SHARE
    )
    INSERT INTO "RecallSnippet" ("id", "tenantId", "endUserId", "conversationId", "kind", "text", "keyOfId", "messageIds", "occurredAt", "createdAt")
    SELECT gen_random_uuid()::text, ${tenantId}, ${conversation.endUserId}, ${conversationId}, 'SUMMARY', w."text", w."keyOfId", '{}', w."occurredAt", ${appNow()}
    FROM jsonb_to_recordset(${JSON.stringify(wanted)}::jsonb) AS w("text" text, "keyOfId" text, "occurredAt" timestamp(3))
    WHERE EXISTS (SELECT 1 FROM "current")
    RETURNING "id"`;
  return created.map((c) => c.id);
}

/** A summary's sentences (Intl's sentence breaks), each a key of its own. */
export function summarySentences(summary: string): string[] {
  const segments = new Intl.Segmenter("en", { granularity: "sentence" }).segment(summary);
  return [...segments].map((s) => s.segment.trim()).filter((s) => s.length > 0);
}

// Words that say nothing about which turn a sentence came from.
const FILLER = new Set(
  "the and for with that this was were are has have had its his her their they them she him you your our not but from about into also then than there what when which who will would could should been being some very just more most other such only over after before while both each".split(" "),
);
/** The distinctive words of a text: lower-cased, no filler words, a plural s cut. */
export const contentWords = (text: string) =>
  new Set((text.toLowerCase().match(/[a-z0-9]+/g) ?? []).filter((w) => w.length > 2 && !FILLER.has(w)).map((w) => w.replace(/(?<=\w{3})s$/, "")));

/**
 * The turn sharing the most distinctive words with a sentence: each shared word weighs by how
 * few of the turns hold it (a word in every turn, such as a speaker's name, weighs nothing). Null
 * when none shares a word; the earlier turn on a tie.
 */
export function closestTurn<T extends { text: string }>(sentence: string, turns: T[]): T | null {
  const bags = turns.map((t) => contentWords(t.text));
  const df = new Map<string, number>();
  for (const bag of bags) for (const w of bag) df.set(w, (df.get(w) ?? 0) + 1);
  const words = [...contentWords(sentence)].filter((w) => df.has(w));
  const weight = (n: number) => (turns.length === 1 ? 1 : Math.log(turns.length / n));
  let best: T | null = null;
  let bestScore = 0;
  bags.forEach((bag, i) => {
    const score = words.reduce((sum, w) => sum + (bag.has(w) ? weight(df.get(w)!) : 0), 0);
    if (score > bestScore) {
      bestScore = score;
      best = turns[i];
    }
  });
  return best;
}

/**
 * Keeps one FACT key per fact of the user that came from a message: the fact's sentence as an
 * extra recall key for the TURN snippet holding that message (a hit on the key is credited to the
 * turn, see fusion.ts). Creates missing keys, re-points or rewrites changed ones and deletes those
 * whose fact or turn is gone; returns the ids to index.
 */
export async function syncFactKeys(db: TenantDb, deps: VectorDeps, endUserId: string): Promise<string[]> {
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
  const toMake: KeyWrite[] = [];
  const toChange: KeyWrite[] = [];
  for (const fact of facts) {
    const turn = turnOf.get(fact.sourceMessageId!);
    if (!turn) continue;
    const key = keyOf.get(fact.id);
    const write = { keyId: key?.id ?? null, factId: fact.id, keyOfId: turn.id, sourceMessageId: fact.sourceMessageId! };
    if (!key) toMake.push(write);
    else {
      wanted.add(key.id);
      if (key.text !== fact.text || key.keyOfId !== turn.id) toChange.push(write);
    }
  }
  const made = await makeFactKeys(db, endUserId, toMake);
  const toIndex = [...made.map((k) => k.id), ...(await rewriteFactKeys(db, toChange))];
  // The facts given a key by this run.
  const created = made.map((k) => k.factId);
  await forgetSnippets(db, deps, keys.filter((k) => !wanted.has(k.id)).map((k) => k.id));
  // Two runs at once (extraction's and the turn's indexing) may each have made a key for the
  // same fact: both keep the oldest and drop the others, so one key is left either way.
  const doubled = created.length ? await doubledKeys(db, created) : [];
  if (doubled.length) await forgetSnippets(db, deps, doubled);
  return toIndex.filter((id) => !doubled.includes(id));
}

type KeyWrite = { keyId: string | null; factId: string; keyOfId: string; sourceMessageId: string };

/**
 * What FACT keys are written from, as syncFactKeys planned them: the common table expressions of
 * the statement that writes them, ending in `w` (each planned key with its fact's text as it is
 * now and its turn's conversation and time). A key is written only while its fact is still there,
 * its message is still there, neither forgotten nor with a fact deleted from it, and its turn's
 * snippet is still there; the statement locks them until it ends (the fact FOR KEY SHARE, which
 * deleteFactRows's FOR UPDATE waits for and which waits for it). A delete that came between the
 * plan's read and the write leaves the key out, and one under way waits for the write and then
 * finds the key (forget.ts): a late sync cannot bring a deleted fact back as a key.
 */
function keySources(tenantId: string, writes: KeyWrite[]): Prisma.Sql {
  return Prisma.sql`${liveMessages("live", tenantId, writes.map((w) => w.sourceMessageId))},
    "fact" AS (
      SELECT f."id", f."text" FROM "Fact" f JOIN "live" m ON m."id" = f."sourceMessageId" AND NOT m."factsForgotten"
      WHERE f."tenantId" = ${tenantId} AND f."id" = ANY(${writes.map((w) => w.factId)}::text[])
      ORDER BY f."id" FOR KEY SHARE OF f
    ), "turn" AS (
      SELECT s."id", s."conversationId", s."occurredAt" FROM "RecallSnippet" s
      WHERE s."tenantId" = ${tenantId} AND s."id" = ANY(${writes.map((w) => w.keyOfId)}::text[]) AND s."kind" = 'TURN'
      ORDER BY s."id" FOR KEY SHARE
    ), "w" AS (
      SELECT r."keyId", r."factId", r."keyOfId", f."text", t."conversationId", t."occurredAt"
      FROM jsonb_to_recordset(${JSON.stringify(writes)}::jsonb) AS r("keyId" text, "factId" text, "keyOfId" text)
      JOIN "fact" f ON f."id" = r."factId" JOIN "turn" t ON t."id" = r."keyOfId"
    )`;
}

/** New FACT keys (keySources); returns those written, with their facts. */
async function makeFactKeys(db: TenantDb, endUserId: string, writes: KeyWrite[]) {
  if (writes.length === 0) return [];
  const tenantId = db.$tenantId();
  return db.$queryRaw<{ id: string; factId: string }[]>`
    WITH ${keySources(tenantId, writes)}
    INSERT INTO "RecallSnippet" ("id", "tenantId", "endUserId", "conversationId", "kind", "text", "messageIds", "occurredAt", "createdAt", "factId", "keyOfId")
    SELECT gen_random_uuid()::text, ${tenantId}, ${endUserId}, w."conversationId", 'FACT', w."text", '{}', w."occurredAt", ${appNow()}, w."factId", w."keyOfId"
    FROM "w"
    RETURNING "id", "factId"`;
}

/** FACT keys re-pointed and rewritten (keySources), to be embedded again; returns the ids of those written. */
async function rewriteFactKeys(db: TenantDb, writes: KeyWrite[]) {
  if (writes.length === 0) return [];
  const tenantId = db.$tenantId();
  const rows = await db.$queryRaw<{ id: string }[]>`
    WITH ${keySources(tenantId, writes)}
    UPDATE "RecallSnippet" k SET "text" = w."text", "keyOfId" = w."keyOfId", "conversationId" = w."conversationId", "occurredAt" = w."occurredAt", "indexedAt" = NULL
    FROM "w" WHERE k."tenantId" = ${tenantId} AND k."id" = w."keyId"
    RETURNING k."id"`;
  return rows.map((r) => r.id);
}

/** Of the keys of these facts, all but the oldest of each fact. */
async function doubledKeys(db: TenantDb, factIds: string[]) {
  const keys = await db.recallSnippet.findMany({
    where: { kind: "FACT", factId: { in: factIds } },
    orderBy: [{ createdAt: "asc" }, { id: "asc" }],
    select: { id: true, factId: true },
  });
  const first = new Set<string>();
  return keys.flatMap((k) => (first.has(k.factId!) ? [k.id] : (first.add(k.factId!), [])));
}

/**
 * Embeds snippets and upserts their vectors, then marks them indexed. Idempotent: a snippet
 * already indexed by the tenant's model is skipped. A snippet forgotten meanwhile leaves no
 * vector behind.
 */
export async function indexSnippets(db: TenantDb, deps: SnippetDeps, snippetIds: string[]) {
  const tenantId = db.$tenantId();
  if (snippetIds.length === 0) return { indexed: 0 };
  const { embeddings, model } = await deps.embeddings.forTenant(tenantId);
  const found = await db.recallSnippet.findMany({ where: { id: { in: snippetIds } } });
  // Asked for and gone: forgotten since. A try before this one may have upserted their vectors
  // and failed (or died) before taking them back out below; a retry finishes that.
  const present = new Set(found.map((s) => s.id));
  const gone = snippetIds.filter((id) => !present.has(id));
  if (gone.length) await deps.vectors.delete(tenantId, { ids: gone });
  // Those with their vector by this model already are left alone: a reconcile sweep that found
  // them waiting, or a retried job, pays no second embedding for them.
  const snippets = found.filter((s) => s.indexedAt === null || s.embeddingModel !== model);
  if (snippets.length === 0) return { indexed: 0 };
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
  // One statement: Prisma's updateMany wraps its UPDATE in BEGIN/COMMIT, three round trips that on
  // the embedded store hold its one session. A key rewritten since it was read (syncFactKeys: a
  // new text, another turn) got a stale vector here, maybe over the one a later job stored for
  // its new text: it is left (or put back) unindexed, for its own job or the reconcile sweep.
  const read = snippets.map((s) => ({ id: s.id, text: s.text, conversationId: s.conversationId, occurredAt: s.occurredAt }));
  const unchanged = Prisma.sql`s."text" = r."text" AND s."conversationId" = r."conversationId" AND s."occurredAt" = r."occurredAt"`;
  const marked = await db.$queryRaw<{ id: string; indexed: boolean }[]>`
    UPDATE "RecallSnippet" s
    SET "indexedAt" = CASE WHEN ${unchanged} THEN ${appNow()} END,
        "embeddingModel" = CASE WHEN ${unchanged} THEN ${model} ELSE s."embeddingModel" END
    FROM jsonb_to_recordset(${JSON.stringify(read)}::jsonb) AS r("id" text, "text" text, "conversationId" text, "occurredAt" timestamp(3))
    WHERE s."tenantId" = ${tenantId} AND s."id" = r."id"
    RETURNING s."id", s."indexedAt" IS NOT NULL AS "indexed"`;
  if (marked.length < snippets.length) {
    // Forgotten between the read and the upsert: take their vectors back out.
    const left = new Set((await db.recallSnippet.findMany({ where: { id: { in: snippetIds } }, select: { id: true } })).map((s) => s.id));
    await deps.vectors.delete(tenantId, { ids: snippets.filter((s) => !left.has(s.id)).map((s) => s.id) });
  }
  return { indexed: marked.filter((m) => m.indexed).length };
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


const LOST_CHECK_BATCH = 500;

/**
 * Of the snippets marked indexed by this model since `since`, those whose vector the vector
 * store no longer has: marked not indexed again and returned, for the caller to re-queue. A
 * vector store can lose an upsert it had acknowledged when it dies straight after (seen with
 * the embedded Chroma under kill -9), and `indexedAt` alone would never tell. Read in pages of
 * LOST_CHECK_BATCH, oldest first.
 */
export async function unmarkLostVectors(
  db: TenantDb,
  vectors: Pick<Deps["vectors"], "present">,
  model: string,
  options: { since: Date },
) {
  const lost: string[] = [];
  let after: { id: string; indexedAt: Date } | undefined;
  for (;;) {
    const page: { id: string; indexedAt: Date | null }[] = await db.recallSnippet.findMany({
      where: {
        embeddingModel: model,
        indexedAt: { gte: options.since },
        ...(after ? { OR: [{ indexedAt: { gt: after.indexedAt } }, { indexedAt: after.indexedAt, id: { gt: after.id } }] } : {}),
      },
      orderBy: [{ indexedAt: "asc" }, { id: "asc" }],
      take: LOST_CHECK_BATCH,
      select: { id: true, indexedAt: true },
    });
    const ids = page.map((r) => r.id);
    const present = await vectors.present({ tenantId: db.$tenantId(), model }, ids);
    const missing = ids.filter((id) => !present.has(id));
    if (missing.length) {
      await db.recallSnippet.updateMany({ where: { id: { in: missing }, embeddingModel: model }, data: { indexedAt: null } });
      lost.push(...missing);
    }
    if (page.length < LOST_CHECK_BATCH) return lost;
    const last = page.at(-1)!;
    after = { id: last.id, indexedAt: last.indexedAt! };
  }
}

export type RecallIndexStatus = { pending: number; oldestPendingAt: Date | null };

/**
 * What recall cannot search yet of an end user's conversations but will: turns still in the
 * outbox, and snippets without a vector (their index job, or the reconcile sweep, embeds them). A
 * turn's TURN snippets are written by the one statement that takes it out of the outbox
 * (takeFromOutbox), which leaves out on purpose what must not be recalled (private steps,
 * forgotten messages, the turn of a deleted fact's message), and nothing writes them later (but an
 * index job with a range, queued by a version before that statement, when it runs): a turn out of
 * the outbox has nothing left to index, whatever a forget, deleteFact or retention has since taken
 * from it. Zero pending: all that will be searchable is.
 */
export async function recallIndexStatus(db: TenantDb, endUserId: string): Promise<RecallIndexStatus> {
  const pending = { _count: { _all: true }, _min: { createdAt: true } } as const;
  const [turns, snippets] = await Promise.all([
    db.turn.aggregate({ where: { followUpsQueuedAt: null, conversation: { endUserId } }, ...pending }),
    db.recallSnippet.aggregate({ where: { endUserId, indexedAt: null }, ...pending }),
  ]);
  const oldest = [turns._min.createdAt, snippets._min.createdAt].filter((d): d is Date => d != null);
  return {
    pending: turns._count._all + snippets._count._all,
    oldestPendingAt: oldest.length ? new Date(Math.min(...oldest.map((d) => d.getTime()))) : null,
  };
}
