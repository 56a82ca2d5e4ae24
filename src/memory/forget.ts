import { appNow, type TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { notFound } from "../errors.ts";
import { Prisma, type Fact } from "../generated/prisma/client.ts";
import { loadTenantSettings } from "../governance/settings.ts";
import { deleteVectorsJob } from "../queue.ts";
import { requireEndUser } from "./conversations/agents.ts";
import { forgetActivity } from "./activity.ts";
import { aboutThePerson } from "./export.ts";
import { normalizeFact } from "./facts/normalize.ts";
import { messageHashOf } from "./gate/gate.ts";
import { matchesAnyPhrase } from "./text-search.ts";

/**
 * Forgetting, in one place. Whatever is forgotten (a user, what a user names, a conversation, a
 * fact, what the retention window let go of) goes from every copy Engram holds: facts and their
 * history, recall snippets and their vectors, summaries and their revisions, the verbatim
 * judge's verdicts, the gate's stored verdicts, the finished job records of the user's
 * conversations, and (when the tenant's `forgetDeletesMessages` is on, the default) the raw
 * messages (when it is off, they are marked forgotten and no snippet is made from them again).
 * What stays is a receipt of kinds and counts, never content, kept in the audit log.
 */
export type ForgetDeps = Pick<Deps, "pubsub" | "vectors" | "embeddings" | "log" | "queue">;

export type ForgetReceipt = {
  facts: number;
  factVersions: number;
  snippets: number;
  summaries: number;
  summaryRevisions: number;
  keptVerdicts: number;
  gateVerdicts: number;
  messages: number;
  jobRecords: number;
  /** Events and entries about the user as an entity (scope ENTITY, their external id as scopeRef), as exportUser lists them. */
  events: number;
  entries: number;
  /** The feed's history rows of the user (ids and kinds only, deleted all the same). */
  activity: number;
};

const emptyReceipt = (): ForgetReceipt => ({
  facts: 0,
  factVersions: 0,
  snippets: 0,
  summaries: 0,
  summaryRevisions: 0,
  keptVerdicts: 0,
  gateVerdicts: 0,
  messages: 0,
  jobRecords: 0,
  events: 0,
  entries: 0,
  activity: 0,
});

export type ForgetWho = {
  apiKeyId?: string | null;
  reason: string;
  /** The conversation the forget was asked in (the gate's "forget my X"). */
  conversationId?: string | null;
  /**
   * The last message of the turn that asked "forget my X": what that conversation said after it,
   * before the forget ran, stays to be read by the extractor and the summary (closeConversations).
   * "Forget everything" (forgetUser) forgets what was said up to its run, as it always did.
   */
  askedThroughSeq?: number | null;
};

async function conversationIdsOf(db: TenantDb, endUserId: string) {
  return (await db.conversation.findMany({ where: { endUserId }, select: { id: true } })).map((c) => c.id);
}

/** What deleting vectors takes: the store, and the queue and log for a delete it does not take. */
export type VectorDeps = Pick<Deps, "vectors" | "log" | "queue">;
type VectorSelector = Parameters<Deps["vectors"]["delete"]>[1];

// Ids per job of vectors whose delete is owed.
const OWED_PER_JOB = 1_000;

/**
 * A forget's delete of vectors. Every search reads its hits back from the rows, so once the rows
 * are gone no search returns these vectors, and a store that cannot be reached (down, not
 * answering) does not stop the forget: a retry would find the rows it already deleted gone and
 * leave the rest (a snippet, a quote, the audit). A delete by ids or by conversation is owed
 * instead, as a job the worker tries until the store takes it (recall.delete-vectors): snippet ids
 * are never used again, nor is a deleted conversation's id. One by end user or by time is only a
 * catch-all for vectors an earlier crash left (the user may go on talking, and old messages may
 * be imported): not replayed later, it is left to reconcile's sweep of vectors whose snippet is
 * gone, the backstop of every delete. Returns whether the store took it.
 */
async function deleteVectors(deps: VectorDeps, tenantId: string, selector: VectorSelector): Promise<boolean> {
  try {
    await deps.vectors.delete(tenantId, selector);
    return true;
  } catch (error) {
    const { ids, endUserId, occurredBefore, ...where } = selector;
    const owed = !endUserId && !occurredBefore;
    deps.log.warn(`forget: the vector store did not delete the vectors; ${owed ? "a job" : "recall's reconcile sweep"} deletes them once it answers`, {
      tenantId,
      error: (error as Error).message,
    });
    if (!owed) return false;
    try {
      if (!ids) await deps.queue.enqueue(deleteVectorsJob, { tenantId, selector: where });
      for (let i = 0; i < (ids?.length ?? 0); i += OWED_PER_JOB) {
        await deps.queue.enqueue(deleteVectorsJob, { tenantId, selector: { ...where, ids: ids!.slice(i, i + OWED_PER_JOB) } });
      }
    } catch (queueError) {
      // The forget has deleted rows already: it goes on, and the sweep is left to take these.
      deps.log.warn("forget: could not queue the vector deletes it owes; recall's reconcile sweep deletes them", { tenantId, error: (queueError as Error).message });
    }
    return false;
  }
}

/** Snippet rows and their vectors; vectors first and again after (an index job may race the delete). */
export async function forgetSnippets(db: TenantDb, deps: VectorDeps, ids: string[]) {
  if (ids.length === 0) return 0;
  const tenantId = db.$tenantId();
  // A turn's keys (its facts' sentences) go with it: their rows cascade, their vectors would not.
  const keys = await db.recallSnippet.findMany({ where: { keyOfId: { in: ids } }, select: { id: true } });
  const snippetIds = [...new Set([...ids, ...keys.map((k) => k.id)])];
  const took = await deleteVectors(deps, tenantId, { ids: snippetIds });
  const { count } = await db.recallSnippet.deleteMany({ where: { id: { in: snippetIds } } });
  // Not owed twice: the owed job runs after this delete anyway.
  if (took) await deleteVectors(deps, tenantId, { ids: snippetIds });
  return count;
}

/** The snippets `where` picks, as forgetSnippets forgets them. */
async function forgetSnippetsWhere(db: TenantDb, deps: VectorDeps, where: Prisma.RecallSnippetWhereInput) {
  return forgetSnippets(db, deps, (await db.recallSnippet.findMany({ where, select: { id: true } })).map((s) => s.id));
}

/**
 * Deletes facts with their recall keys (FACT snippets): the keys' rows would cascade with the
 * facts, their vectors would not, and a vector left behind keeps the forgotten sentence's
 * embedding searchable and takes a place among the hits. Quotes of them in the user's other
 * facts' histories go too. `where` may narrow the delete (a fact refreshed meanwhile stays, and
 * so does its key). One transaction (deleteFactRows), then the keys' vectors. Returns how many
 * facts and keys went.
 */
export async function deleteFacts(
  db: TenantDb,
  deps: VectorDeps,
  factIds: string[],
  where: Prisma.FactWhereInput = {},
): Promise<{ facts: number; snippets: number; factIds: string[]; sources: string[]; texts: string[]; versions: number }> {
  if (factIds.length === 0) return { facts: 0, snippets: 0, factIds: [], sources: [], texts: [], versions: 0 };
  const { deleted, afterCommit } = await db.$transaction((tx) => deleteFactRows(tx as TenantDb, factIds, where));
  await afterCommit(db, deps);
  return deleted;
}

/** Every text the facts had, with their users (other facts' histories may quote them), and the messages they were read from. */
function quotableTextsOf(db: TenantDb, where: Prisma.FactWhereInput) {
  return db.fact.findMany({
    where,
    select: { id: true, text: true, endUserId: true, sourceMessageId: true, versions: { select: { text: true, sourceMessageId: true } } },
  });
}

/** Every text a fact had: its own and its versions'. */
const textsOf = (fact: { text: string; versions: { text: string }[] }) => [fact.text, ...fact.versions.map((v) => v.text)];

async function scrubQuotesOf(db: TenantDb, doomed: { endUserId: string; text: string; versions: { text: string }[] }[]) {
  for (const endUserId of new Set(doomed.map((f) => f.endUserId))) {
    const texts = [...new Set(doomed.filter((f) => f.endUserId === endUserId).flatMap(textsOf))];
    // The forms a reason quotes another fact in: "contradicts: …", "replaces: …", "… “…”" (chr 8220
    // and 8221 are those quotes, as `quote` in contradictions.ts writes them).
    await scrubQuotes(db, endUserId, Prisma.sql`EXISTS (SELECT 1 FROM unnest(${texts}::text[]) q(t)
      WHERE v."reason" IN ('contradicts: ' || q.t, 'replaces: ' || q.t) OR strpos(v."reason", chr(8220) || q.t || chr(8221)) > 0)`);
  }
}

/** The messages facts and their versions were read from. */
function sourcesOf(facts: { sourceMessageId: string | null; versions: { sourceMessageId: string | null }[] }[]): string[] {
  const ids = facts.flatMap((f) => [f.sourceMessageId, ...f.versions.map((v) => v.sourceMessageId)]);
  return [...new Set(ids.filter((id): id is string => id !== null))];
}

/**
 * Inside a transaction: locks the facts, reads their recall keys and deletes the facts (the keys'
 * rows cascade); once it has committed, the returned `afterCommit` scrubs the quotes and takes the
 * keys' vectors out. The lock comes first: a key syncFactKeys writes for one of them meanwhile
 * either committed before, and is read here, or waits for the lock (its statement locks the fact)
 * and then finds the fact gone and writes nothing. Read before the lock, a key written in between
 * would go with its fact's row and leave its vector behind.
 */
export async function deleteFactRows(tx: TenantDb, factIds: string[], where: Prisma.FactWhereInput = {}) {
  const none = {
    deleted: { facts: 0, snippets: 0, factIds: [] as string[], sources: [] as string[], texts: [] as string[], versions: 0 },
    afterCommit: async (_db: TenantDb, _deps: VectorDeps) => {},
  };
  if (factIds.length === 0) return none;
  await tx.$queryRaw`SELECT "id" FROM "Fact" WHERE "tenantId" = ${tx.$tenantId()} AND "id" = ANY(${factIds}::text[]) ORDER BY "id" FOR UPDATE`;
  const doomed = await quotableTextsOf(tx, { ...where, id: { in: factIds } });
  if (doomed.length === 0) return none;
  const ids = doomed.map((f) => f.id);
  const keyIds = (await tx.recallSnippet.findMany({ where: { factId: { in: ids } }, select: { id: true } })).map((k) => k.id);
  const { count } = await tx.fact.deleteMany({ where: { id: { in: ids } } });
  return {
    deleted: {
      facts: count,
      snippets: keyIds.length,
      factIds: ids,
      sources: sourcesOf(doomed),
      texts: doomed.flatMap(textsOf),
      versions: doomed.reduce((n, f) => n + f.versions.length, 0),
    },
    afterCommit: async (db: TenantDb, deps: VectorDeps) => {
      await scrubQuotesOf(db, doomed);
      if (keyIds.length) await deleteVectors(deps, db.$tenantId(), { ids: keyIds });
    },
  };
}

/**
 * The versions in facts' histories that were read from messages a forget takes, where the fact
 * stays (its current text was read from another message, so it is not among the facts the forget
 * deletes): a version's text is a copy of what its message said. Quotes of their texts in other
 * versions' reasons ("replaces: …") go too. Versions written before migration 0018 name no
 * message but each fact's newest, which is the fact's own. Returns how many versions went.
 */
async function forgetVersionsReadFrom(db: TenantDb, messageIds: string[]): Promise<number> {
  if (messageIds.length === 0) return 0;
  const gone = await db.$queryRaw<{ text: string; endUserId: string }[]>`
    DELETE FROM "FactVersion" v USING "Fact" f
    WHERE v."factId" = f."id" AND v."tenantId" = ${db.$tenantId()} AND v."sourceMessageId" = ANY(${messageIds}::text[])
      AND (f."sourceMessageId" IS NULL OR NOT f."sourceMessageId" = ANY(${messageIds}::text[]))
    RETURNING v."text", f."endUserId"`;
  if (gone.length === 0) return 0;
  // A text the user's facts still say (another fact, or another version read from a message that
  // stays) keeps its quotes.
  const stillSaid = new Set(
    (
      await db.$queryRaw<{ endUserId: string; text: string }[]>`
        SELECT f."endUserId", v."text" FROM "FactVersion" v JOIN "Fact" f ON f."id" = v."factId"
        WHERE f."tenantId" = ${db.$tenantId()} AND v."text" = ANY(${gone.map((g) => g.text)}::text[])
        UNION SELECT f."endUserId", f."text" FROM "Fact" f
        WHERE f."tenantId" = ${db.$tenantId()} AND f."text" = ANY(${gone.map((g) => g.text)}::text[])`
    ).map((r) => `${r.endUserId}\u0000${r.text}`),
  );
  const unsaid = gone.filter((g) => !stillSaid.has(`${g.endUserId}\u0000${g.text}`));
  await scrubQuotesOf(db, unsaid.map((version) => ({ ...version, versions: [] })));
  return gone.length;
}

/** Adds what deleteFacts removed to a receipt: the facts, their versions (as read under the delete's lock) and their keys. */
function countDeleted(receipt: ForgetReceipt, deleted: { facts: number; snippets: number; versions: number }) {
  receipt.facts += deleted.facts;
  receipt.factVersions += deleted.versions;
  receipt.snippets += deleted.snippets;
}

// What a quote of a forgotten fact in another fact's history becomes.
const QUOTE_FORGOTTEN = "(quoted a fact since forgotten)";

/**
 * Another fact's history may quote a fact that is forgotten ("contradicts: …", "both kept, with “…”":
 * facts.ts, contradictions.ts): the quote goes, the history stays. `quotes` picks the versions
 * (`v`) whose reason quotes it. Returns how many reasons were cleared.
 */
async function scrubQuotes(db: TenantDb, endUserId: string, quotes: Prisma.Sql) {
  return db.$executeRaw`
    UPDATE "FactVersion" v SET "reason" = ${QUOTE_FORGOTTEN}
    FROM "Fact" f
    WHERE v."factId" = f."id" AND f."tenantId" = ${db.$tenantId()} AND f."endUserId" = ${endUserId}
      AND v."reason" IS NOT NULL AND v."reason" <> ${QUOTE_FORGOTTEN} AND ${quotes}`;
}

/**
 * After a forget, nothing already said in these conversations is read again: the extractor's
 * progress and the summary's coverage move to the last message, and the summaries of those in
 * `clear` are cleared, in one statement. The conversation the forget was asked in (`asked`) moves
 * only through the turn that asked: what it said after that turn and before the forget ran is
 * read as usual (the forget deleted any of it that matched). Progress only moves forward.
 *
 * A forget does this first, and again at its end: a summary rewrite begun before finds the summary
 * it started from moved, or a message it read gone, and writes nothing (its compare-and-set,
 * summary.ts), so neither a revision nor a first summary of what is being forgotten lands after
 * the forget has deleted them; one that landed in between is cleared by the second. Returns how
 * many summaries were cleared.
 */
async function closeConversations(
  db: TenantDb,
  conversationIds: string[],
  clear: string[] = [],
  asked: { conversationId?: string | null; askedThroughSeq?: number | null } = {},
): Promise<number> {
  if (conversationIds.length === 0) return 0;
  const through = Prisma.sql`CASE WHEN c."id" = ${asked.conversationId ?? null}::text AND ${asked.askedThroughSeq ?? null}::int IS NOT NULL
    THEN LEAST(${asked.askedThroughSeq ?? null}::int, c."lastSeq") ELSE c."lastSeq" END`;
  const [{ cleared }] = await db.$queryRaw<{ cleared: number }[]>`
    WITH "before" AS (
      SELECT "id", "summary" IS NOT NULL AND "id" = ANY(${clear}::text[]) AS "clearing" FROM "Conversation"
      WHERE "tenantId" = ${db.$tenantId()} AND "id" = ANY(${conversationIds}::text[])
      ORDER BY "id"
      FOR NO KEY UPDATE
    ), "closed" AS (
      UPDATE "Conversation" c SET "extractedThroughSeq" = GREATEST(c."extractedThroughSeq", ${through}),
        "summaryThroughSeq" = GREATEST(c."summaryThroughSeq", ${through}),
        "summary" = CASE WHEN b."clearing" THEN NULL ELSE c."summary" END
      FROM "before" b WHERE c."id" = b."id"
      RETURNING b."clearing"
    )
    SELECT count(*) FILTER (WHERE "clearing")::int AS "cleared" FROM "closed"`;
  return cleared;
}

/**
 * What a forget does to the messages that `where` picks: clears their keep scores, then deletes
 * them (or marks them forgotten). Each statement locks them in id order first: a snippet's insert
 * locks the messages it is made of in the same order (insertTurnSnippets), so the two never wait
 * on each other in a cycle. Returns how many kept scores were cleared and messages deleted, and
 * the messages deleted or marked, with their conversations.
 */
async function forgetMessages(db: TenantDb, where: Prisma.Sql, remove: boolean) {
  // An update of other columns locks FOR NO KEY UPDATE; a delete takes the stronger FOR UPDATE.
  const picked = (also: Prisma.Sql, lock = Prisma.sql`FOR NO KEY UPDATE`) =>
    Prisma.sql`SELECT m."id" FROM "Message" m WHERE m."tenantId" = ${db.$tenantId()} AND ${where} ${also} ORDER BY m."id" ${lock}`;
  const unscored = await db.$executeRaw`
    UPDATE "Message" SET "keepScore" = NULL WHERE "id" IN (${picked(Prisma.sql`AND m."keepScore" IS NOT NULL`)})`;
  type Gone = { id: string; conversationId: string };
  if (!remove) {
    const marked = await db.$queryRaw<Gone[]>`
      UPDATE "Message" SET "forgottenAt" = ${appNow()} WHERE "id" IN (${picked(Prisma.sql`AND m."forgottenAt" IS NULL`)}) RETURNING "id", "conversationId"`;
    return { unscored, removed: 0, gone: marked };
  }
  const removed = await db.$queryRaw<Gone[]>`
    DELETE FROM "Message" WHERE "id" IN (${picked(Prisma.empty, Prisma.sql`FOR UPDATE`)}) RETURNING "id", "conversationId"`;
  return { unscored, removed: removed.length, gone: removed };
}

/** Finished job records of these conversations, and dead letters (their payloads name what was worked on). */
async function forgetJobRecords(db: TenantDb, conversationIds: string[], turnIds: string[]) {
  if (conversationIds.length === 0 && turnIds.length === 0) return 0;
  const tenantId = db.$tenantId();
  // Dead letters, recorded as job runs, name the work they gave up on.
  const runs = await db.$executeRaw`
    DELETE FROM "JobRun"
    WHERE "tenantId" = ${tenantId}
      AND ("result"->>'conversationId' = ANY(${conversationIds}::text[]) OR "result"->>'turnId' = ANY(${turnIds}::text[]))`;
  return runs + (await onQueueTable(db.$executeRaw`
    DELETE FROM "agenda_jobs"
    WHERE "data"->>'tenantId' = ${tenantId}
      AND "last_finished_at" IS NOT NULL AND "next_run_at" IS NULL
      AND ("data"->>'conversationId' = ANY(${conversationIds}::text[]) OR "data"->>'turnId' = ANY(${turnIds}::text[]))`));
}

const PRUNE_BATCH = 1_000;

/** A statement on the job queue's table, which the worker makes on its first start: without it there is nothing to delete. */
function onQueueTable(statement: Promise<number>): Promise<number> {
  return statement.catch((error: unknown) => {
    if (error instanceof Prisma.PrismaClientKnownRequestError && /does not exist/.test(error.message)) return 0;
    throw error;
  });
}

/**
 * The queue's records of this tenant's one-off jobs that finished before `before`, succeeded or
 * given up (a dead letter keeps its own JobRun). Agenda keeps them otherwise for ever: the table
 * grows by a row per job, and their payloads name conversations and turns, so a job still
 * retrying when its user was forgotten left one behind once it finished. Recurring jobs (a next
 * run) and running ones (locked) stay.
 */
export async function pruneFinishedJobs(db: TenantDb, before: Date): Promise<number> {
  let deleted = 0;
  // In batches: the first night after an upgrade finds the whole backlog, and on the embedded
  // store every request waits behind the statement running. The column is a timestamptz, and a
  // Date parameter is sent without a zone (read in the session's), hence the ISO text and cast.
  for (;;) {
    const batch = await onQueueTable(db.$executeRaw`
      DELETE FROM "agenda_jobs" WHERE "id" IN (
        SELECT "id" FROM "agenda_jobs"
        WHERE "data"->>'tenantId' = ${db.$tenantId()}
          AND "next_run_at" IS NULL AND "locked_at" IS NULL AND "last_finished_at" < ${before.toISOString()}::timestamptz
        LIMIT ${PRUNE_BATCH})`);
    deleted += batch;
    if (batch < PRUNE_BATCH) return deleted;
  }
}

async function audit(db: TenantDb, who: ForgetWho, target: Record<string, unknown>, receipt: ForgetReceipt) {
  await db.auditLog.create({
    data: {
      tenantId: db.$tenantId(),
      apiKeyId: who.apiKeyId ?? null,
      action: "memory.forget",
      changes: { target, receipt } as Prisma.InputJsonValue,
    },
  });
}

/** Announces the forget and waits for its history row, so the feed shows it once the caller has the receipt. */
async function announceForgotten(db: TenantDb, deps: ForgetDeps, endUserId: string, who: ForgetWho) {
  // A query vector this instance kept may be of a message that was just forgotten.
  deps.embeddings.forgetQueries(db.$tenantId());
  deps.pubsub.publish("factChanged", db.$tenantId(), {
    endUserId,
    factId: null,
    text: null,
    change: "FORGOTTEN",
    reason: who.reason,
    conversationId: who.conversationId ?? null,
  });
  await deps.pubsub.settled();
}

/** "Forget everything": every copy of what Engram holds about one end user. */
export async function forgetUser(db: TenantDb, deps: ForgetDeps, endUserId: string, who: ForgetWho) {
  await requireEndUser(db, endUserId);
  const settings = await loadTenantSettings(db);
  const conversationIds = await conversationIdsOf(db, endUserId);
  const inTheirs = { conversationId: { in: conversationIds } };
  const receipt = emptyReceipt();
  receipt.summaries = await closeConversations(db, conversationIds, conversationIds);

  receipt.snippets = await forgetSnippetsWhere(db, deps, { endUserId });
  // Vectors whose rows went earlier without them (a crash mid-forget) go by their metadata.
  await deleteVectors(deps, db.$tenantId(), { endUserId });

  const factIds = (await db.fact.findMany({ where: { endUserId }, select: { id: true } })).map((f) => f.id);
  countDeleted(receipt, await deleteFacts(db, deps, factIds));
  receipt.gateVerdicts = (await db.gateVerdict.deleteMany({ where: inTheirs })).count;
  receipt.summaryRevisions = (await db.summaryRevision.deleteMany({ where: inTheirs })).count;
  const messages = await forgetMessages(db, Prisma.sql`m."conversationId" = ANY(${conversationIds}::text[])`, settings.forgetDeletesMessages);
  receipt.keptVerdicts = messages.unscored;
  receipt.messages = messages.removed;
  // Again, once the messages are gone, for a summary begun from what the user said while the
  // forget ran: closing waits for a rewrite under way and clears what it wrote, and none can land
  // from now on (a message it read is gone); then its revision goes.
  receipt.summaries += await closeConversations(db, conversationIds, conversationIds);
  receipt.summaryRevisions += (await db.summaryRevision.deleteMany({ where: inTheirs })).count;
  // A second look: snippets of the messages that a turn's indexing (or a summary's keys) planned
  // before and wrote after the first. From now on none can be written: insertTurnSnippets checks
  // and locks the messages a snippet is made of, syncSummaryKeys the summary its keys come from.
  receipt.snippets += await forgetSnippetsWhere(db, deps, { conversationId: { in: conversationIds } });
  // Facts an extraction that read the messages before wrote after the first delete (a fact
  // written from now on finds its message gone: facts.ts).
  const lateFacts = (await db.fact.findMany({ where: { endUserId }, select: { id: true } })).map((f) => f.id);
  countDeleted(receipt, await deleteFacts(db, deps, lateFacts));
  // And the gate's verdicts a turn's work stored meanwhile.
  receipt.gateVerdicts += (await db.gateVerdict.deleteMany({ where: inTheirs })).count;
  const turnIds = (await db.turn.findMany({ where: inTheirs, select: { id: true } })).map((t) => t.id);
  receipt.jobRecords = await forgetJobRecords(db, conversationIds, turnIds);
  // Announcements still being recorded land first, then go with the rest.
  await deps.pubsub.settled();
  const { externalId } = await db.endUser.findUniqueOrThrow({ where: { id: endUserId }, select: { externalId: true } });
  receipt.events = (await db.memoryEvent.deleteMany({ where: aboutThePerson(externalId) })).count;
  receipt.entries = (await db.memoryEntry.deleteMany({ where: aboutThePerson(externalId) })).count;
  receipt.activity = await forgetActivity(db, endUserId, conversationIds, externalId);
  // The person's name goes too; the row stays, under the caller's own id, for the audited receipts.
  await db.endUser.updateMany({ where: { id: endUserId }, data: { displayName: null } });

  await audit(db, who, { kind: "USER", endUserId }, receipt);
  await announceForgotten(db, deps, endUserId, who);
  return receipt;
}

/**
 * "Forget my X": what matches any of the phrases (full-text, so "my address" reaches "lives at
 * 4 Elm Street" only if the words match) goes from every copy, as for a whole user; a message a
 * matching fact was extracted from goes with it, though its own words may not match.
 */
export async function forgetPhrases(
  db: TenantDb,
  deps: ForgetDeps,
  endUserId: string,
  phrases: string[],
  who: ForgetWho,
) {
  const receipt = emptyReceipt();
  const wanted = phrases.map((p) => p.trim()).filter(Boolean);
  if (wanted.length === 0) return receipt;
  await requireEndUser(db, endUserId);
  const settings = await loadTenantSettings(db);
  const tenantId = db.$tenantId();
  const conversationIds = await conversationIdsOf(db, endUserId);
  const matches = (column: Prisma.Sql) => matchesAnyPhrase(Prisma.sql`to_tsvector('english', ${column})`, wanted);
  const ids = async (query: Prisma.Sql) => (await db.$queryRaw<{ id: string }[]>(query)).map((r) => r.id);

  // The facts that say it: their text (with whom it is about: "forget what I said about Ana"
  // takes the facts whose subject is "Ana (daughter)"), or a version in their history, matches.
  const factText = matches(Prisma.sql`concat_ws(' ', f."text", f."subject")`);
  const factsSaying = Prisma.sql`
    SELECT f."id" FROM "Fact" f
    WHERE f."tenantId" = ${tenantId} AND f."endUserId" = ${endUserId}
      AND (${factText} OR EXISTS (SELECT 1 FROM "FactVersion" v WHERE v."factId" = f."id" AND ${matches(Prisma.sql`v."text"`)}))`;
  // The messages that say it: in their own words, or as the fact extracted from them now says it
  // ("forget where I live" matches the fact "The user lives at 4 Elm Street", not the message "We
  // just moved to 4 Elm Street", which recall would still find). The facts from a message that
  // goes go with it, as for any message a forget takes: a fact does not outlive what it was read
  // from (and deleteConversation finds a fact by its message). A version in a fact's history that
  // says it leads to the message that version was read from (versions written before migration
  // 0018 name none but the newest).
  const told = Prisma.sql`
    SELECT f."sourceMessageId" AS "id" FROM "Fact" f WHERE f."tenantId" = ${tenantId} AND f."endUserId" = ${endUserId} AND ${factText}
    UNION
    SELECT v."sourceMessageId" FROM "FactVersion" v JOIN "Fact" f ON f."id" = v."factId"
    WHERE v."tenantId" = ${tenantId} AND f."endUserId" = ${endUserId} AND v."sourceMessageId" IS NOT NULL AND ${matches(Prisma.sql`v."text"`)}`;
  const saying = Prisma.sql`(${matches(Prisma.sql`m."content"`)} OR m."id" IN (${told}))`;
  const inTheirs = Prisma.sql`m."tenantId" = ${tenantId} AND m."conversationId" = ANY(${conversationIds}::text[])`;
  // Those messages, and every copy derived from them: facts extracted from them or saying it,
  // versions of other facts' histories read from them,
  // snippets holding them or matching, and the summaries of their conversations (a summary need
  // not repeat the words to carry what they said).
  const messageIds = conversationIds.length ? await ids(Prisma.sql`SELECT m."id" FROM "Message" m WHERE ${inTheirs} AND ${saying}`) : [];
  const affected = conversationIds.length
    ? await ids(Prisma.sql`
        SELECT c."id" FROM "Conversation" c
        WHERE c."tenantId" = ${tenantId} AND c."endUserId" = ${endUserId}
          AND (EXISTS (SELECT 1 FROM "Message" m WHERE m."conversationId" = c."id" AND m."id" = ANY(${messageIds}::text[]))
            OR (c."summary" IS NOT NULL AND ${matches(Prisma.sql`c."summary"`)})
            OR EXISTS (SELECT 1 FROM "SummaryRevision" r WHERE r."conversationId" = c."id" AND ${matches(Prisma.sql`r."text"`)}))`)
    : [];
  receipt.summaries = await closeConversations(db, affected, affected, who);
  // Facts and snippets are looked for twice: now, and once the messages are gone, for those that
  // work already under way (an extraction, a turn's indexing) wrote in between.
  const forgetFactsAndSnippets = async () => {
    // A fact saying it written meanwhile from a message not picked: that message's snippets and
    // other facts go too.
    for (const id of await ids(told)) if (id && !messageIds.includes(id)) messageIds.push(id);
    const factIds = await ids(Prisma.sql`
      SELECT f."id" FROM "Fact" f
      WHERE f."tenantId" = ${tenantId} AND f."endUserId" = ${endUserId} AND f."sourceMessageId" = ANY(${messageIds}::text[])
      UNION ${factsSaying}`);
    countDeleted(receipt, await deleteFacts(db, deps, factIds));
    receipt.factVersions += await forgetVersionsReadFrom(db, messageIds);
    // A snippet's indexed column also holds its date as words ("wednesday", "2024"), which a
    // phrase must not match: the index finds the candidates, the snippet's own words decide.
    const snippetIds = await ids(Prisma.sql`
      SELECT s."id" FROM "RecallSnippet" s
      WHERE s."tenantId" = ${tenantId} AND s."endUserId" = ${endUserId}
        AND (s."messageIds" && ${messageIds}::text[] OR (${matchesAnyPhrase(Prisma.sql`s."search"`, wanted)} AND ${matches(Prisma.sql`s."text"`)})
          OR (s."kind" = 'SUMMARY' AND s."conversationId" = ANY(${affected}::text[])))`);
    receipt.snippets += await forgetSnippets(db, deps, snippetIds);
  };
  await forgetFactsAndSnippets();

  if (conversationIds.length) {
    const forgetRevisions = async () => {
      receipt.summaryRevisions += (await db.summaryRevision.deleteMany({ where: { conversationId: { in: affected } } })).count;
    };
    await forgetRevisions();
    // The words are looked for again as the messages go: one said while the forget ran goes too
    // (the conversation that asked is open to the extractor and the summary after the turn that
    // asked), and its conversation is closed with the others.
    const messages = await forgetMessages(
      db,
      Prisma.sql`${inTheirs} AND (m."id" = ANY(${messageIds}::text[]) OR ${saying})`,
      settings.forgetDeletesMessages,
    );
    receipt.keptVerdicts = messages.unscored;
    receipt.messages = messages.removed;
    for (const gone of messages.gone) {
      if (!messageIds.includes(gone.id)) messageIds.push(gone.id);
      if (!affected.includes(gone.conversationId)) affected.push(gone.conversationId);
    }
    // Again, once the messages are gone: a summary rewrite may have read a matching message said
    // after the turn that asked, before its delete. Closing waits for a rewrite under way and
    // clears what it wrote; none can land from now on (a message it read is gone: summary.ts).
    // Its revision and keys go with the second look.
    receipt.summaries += await closeConversations(db, affected, affected, who);
    await forgetRevisions();
    await forgetFactsAndSnippets();
    // Stored verdicts name what was asked to be forgotten (and hash what was said); they are only
    // a cache of the gate's answer. Those of what the conversation that asked still holds after
    // that turn, asking nothing forgotten, stay: those turns are judged after it (a caller's
    // verdict would otherwise be lost, and the model asked again).
    const pending = await pendingVerdictHashes(db, who);
    receipt.gateVerdicts = (
      await db.gateVerdict.deleteMany({
        where: {
          conversationId: { in: conversationIds },
          ...(pending.length && { NOT: { conversationId: who.conversationId ?? undefined, forget: "NONE", messageHash: { in: pending } } }),
        },
      })
    ).count;
  }

  await scrubQuotes(db, endUserId, matches(Prisma.sql`v."reason"`));
  Object.assign(receipt, await forgetNotesSaying(db, endUserId, wanted));
  await audit(db, who, { kind: "PHRASES", endUserId, phrases: wanted.length }, receipt);
  await announceForgotten(db, deps, endUserId, who);
  return receipt;
}

/**
 * The events and entries about the person as an entity (their own scope, as forgetUser deletes
 * and exportUser lists them) that match any of the phrases, and the entries a matching event was
 * folded into by compaction (an entry need not repeat the words to carry what they said). The
 * events' delete names those entries itself: a compaction folding one meanwhile either commits
 * first, and its entry is named, or finds the event gone and rolls back (compaction.ts).
 */
async function forgetNotesSaying(db: TenantDb, endUserId: string, phrases: string[]) {
  const { externalId } = await db.endUser.findUniqueOrThrow({ where: { id: endUserId }, select: { externalId: true } });
  const tenantId = db.$tenantId();
  const events = await db.$queryRaw<{ entryId: string | null }[]>`
    DELETE FROM "MemoryEvent" v
    WHERE v."tenantId" = ${tenantId} AND v."scope" = 'ENTITY' AND v."scopeRef" = ${externalId} AND ${matchesAnyPhrase(Prisma.sql`v."search"`, phrases)}
    RETURNING v."entryId"`;
  const foldedInto = [...new Set(events.flatMap((v) => (v.entryId ? [v.entryId] : [])))];
  // The other notes folded into a deleted entry are in no entry now: they wait for compaction again.
  const [{ entries }] = await db.$queryRaw<{ entries: number }[]>`
    WITH gone AS (
      DELETE FROM "MemoryEntry" e
      WHERE e."tenantId" = ${tenantId} AND e."scope" = 'ENTITY' AND e."scopeRef" = ${externalId}
        AND (${matchesAnyPhrase(Prisma.sql`e."search"`, phrases)} OR e."id" = ANY(${foldedInto}::text[])
          -- Its tags say it too (the indexed column holds only the title and summary).
          OR ${matchesAnyPhrase(Prisma.sql`to_tsvector('english', array_to_string(e."tags", ' '))`, phrases)})
      RETURNING e."id"
    ), unfolded AS (
      UPDATE "MemoryEvent" v SET "compressedAt" = NULL
      WHERE v."tenantId" = ${tenantId} AND v."entryId" IN (SELECT "id" FROM gone)
      RETURNING v."id"
    )
    SELECT count(*)::int AS "entries" FROM gone`;
  return { events: events.length, entries };
}

/** The message hashes of the user messages the conversation that asked holds after the turn that asked. */
async function pendingVerdictHashes(db: TenantDb, who: ForgetWho) {
  if (!who.conversationId || who.askedThroughSeq == null) return [];
  const said = await db.message.findMany({
    where: { conversationId: who.conversationId, seq: { gt: who.askedThroughSeq }, role: "USER", forgottenAt: null },
    select: { content: true },
  });
  return said.map((m) => messageHashOf(m.content));
}

/**
 * Deletes a conversation with everything derived from it. The vectors go first, and again once
 * the conversation's row is gone (rows cascade, vectors would not): a summary accepted before the
 * delete may have its keys written and indexed while it runs (they need the summary, not the
 * messages), and a conversation's id is never used again.
 */
export async function forgetConversation(db: TenantDb, deps: ForgetDeps, conversationId: string, who: ForgetWho) {
  const conversation = await db.conversation.findUnique({ where: { id: conversationId } });
  if (!conversation) throw notFound("Conversation", conversationId);
  const receipt = emptyReceipt();
  const tenantId = db.$tenantId();
  const took = await deleteVectors(deps, tenantId, { conversationId });
  receipt.snippets = (await db.recallSnippet.deleteMany({ where: { conversationId } })).count;
  receipt.summaryRevisions = await db.summaryRevision.count({ where: { conversationId } });
  receipt.summaries = conversation.summary ? 1 : 0;
  receipt.gateVerdicts = (await db.gateVerdict.deleteMany({ where: { conversationId } })).count;
  // The facts extracted from its messages, with their history and recall keys, and the versions
  // of other facts' histories read from them.
  const messageIds = new Set<string>();
  // Read again before the messages go: a turn recorded while the delete runs adds messages.
  const noteMessages = async () => {
    for (const m of await db.message.findMany({ where: { conversationId }, select: { id: true } })) messageIds.add(m.id);
  };
  const deleteItsFacts = async () => {
    const ids = (
      await db.fact.findMany({ where: { endUserId: conversation.endUserId, sourceMessageId: { in: [...messageIds] } }, select: { id: true } })
    ).map((f) => f.id);
    countDeleted(receipt, await deleteFacts(db, deps, ids));
    receipt.factVersions += await forgetVersionsReadFrom(db, [...messageIds]);
  };
  await noteMessages();
  await deleteItsFacts();
  const turnIds = (await db.turn.findMany({ where: { conversationId }, select: { id: true } })).map((t) => t.id);
  receipt.jobRecords = await forgetJobRecords(db, [conversationId], turnIds);
  await noteMessages();
  const messages = await forgetMessages(db, Prisma.sql`m."conversationId" = ${conversationId}`, true);
  receipt.messages = messages.removed;
  // One recorded after the second look above went too: what was read from it goes with the rest.
  for (const gone of messages.gone) messageIds.add(gone.id);
  // A second look, as forgetUser's, at what work under way wrote from the messages meanwhile
  // (a fact or a verdict written from now on finds its message gone).
  receipt.snippets += await forgetSnippetsWhere(db, deps, { conversationId });
  await deleteItsFacts();
  receipt.gateVerdicts += (await db.gateVerdict.deleteMany({ where: { conversationId } })).count;
  deps.embeddings.forgetQueries(tenantId);
  await deps.pubsub.settled();
  receipt.activity = (await db.activityLog.deleteMany({ where: { conversationId } })).count;
  await db.conversation.deleteMany({ where: { id: conversationId } });
  // Not owed twice: a delete the store did not take is owed as a job, which runs after this anyway.
  if (took) await deleteVectors(deps, tenantId, { conversationId });
  await audit(db, who, { kind: "CONVERSATION", conversationId, endUserId: conversation.endUserId }, receipt);
  return { conversation, receipt };
}

/**
 * Deletes a fact for good, its history included, and the recall snippets of the messages it came
 * from: the current text's, and those of its earlier versions (an updated address leaves the old
 * one in the message it was read from). Those messages are marked (`factsForgottenAt`) so no fact
 * is written from them again: an extraction that read one before this delete would otherwise
 * write the fact back. The mark waits for a fact being written from a message (which locks it,
 * facts.ts), and the facts written from them between the first read here and the mark go too, as
 * does the same fact written from one of them again just before. The receipt of counts is
 * audited, as for the other forgets.
 */
export async function forgetFact(db: TenantDb, deps: ForgetDeps, factId: string, who: ForgetWho) {
  const found = await db.fact.findUnique({ where: { id: factId }, include: { versions: { select: { text: true, sourceMessageId: true } } } });
  if (!found) throw notFound("Fact", factId);
  const { versions, ...fact } = found;
  // The same fact, as any of its versions said it.
  const texts = new Set(textsOf(found).map(normalizeFact));
  const receipt = emptyReceipt();
  const marked = new Set<string>();
  const late: Fact[] = [];
  // Marks the messages, then finds the facts written from them meanwhile, or the same fact written
  // from one of them again just before.
  const markAndSweep = async (sources: string[]) => {
    const fresh = sources.filter((id) => !marked.has(id));
    if (fresh.length === 0) return;
    const fromThem = () => db.fact.findMany({ where: { sourceMessageId: { in: fresh } } });
    const before = new Set((await fromThem()).map((f) => f.id));
    // In id order, as every statement that locks several messages takes them.
    await db.$executeRaw`
      UPDATE "Message" SET "factsForgottenAt" = ${appNow()}, "keepScore" = NULL
      WHERE "id" IN (SELECT "id" FROM "Message" WHERE "tenantId" = ${db.$tenantId()} AND "id" = ANY(${fresh}::text[]) ORDER BY "id" FOR NO KEY UPDATE)`;
    for (const id of fresh) marked.add(id);
    const again = (await fromThem()).filter((f) => f.id !== fact.id && (!before.has(f.id) || texts.has(normalizeFact(f.text))));
    if (again.length === 0) return;
    const deleted = await deleteFacts(db, deps, again.map((f) => f.id));
    late.push(...again.filter((f) => deleted.factIds.includes(f.id)));
    countDeleted(receipt, deleted);
  };
  await markAndSweep(sourcesOf([found]));
  const gone = await deleteFacts(db, deps, [factId]);
  countDeleted(receipt, gone);
  // An update of the fact from another message committed between the first read and the delete's
  // lock: that message is marked too, and its text is the fact's too.
  for (const text of gone.texts) texts.add(normalizeFact(text));
  await markAndSweep(gone.sources);
  if (marked.size) receipt.snippets += await forgetSnippetsWhere(db, deps, { messageIds: { hasSome: [...marked] } });
  await clearSummariesFolding(db, deps, [...marked], receipt);
  await audit(db, who, { kind: "FACT", endUserId: fact.endUserId, factId }, receipt);
  // As it was when deleted (an update may have come in between), and only by the delete that took it.
  const deletedFact = { ...fact, text: gone.texts[0] ?? fact.text };
  for (const deleted of [...(gone.facts ? [deletedFact] : []), ...late]) {
    deps.pubsub.publish("factChanged", db.$tenantId(), {
      endUserId: deleted.endUserId,
      factId: deleted.id,
      text: deleted.text,
      change: "DELETED",
      reason: who.reason,
      conversationId: who.conversationId ?? null,
    });
  }
  return fact;
}

/**
 * The summaries that folded any of these (marked) messages: cleared, with the revisions that
 * covered them and the summaries' recall keys, so that what a deleted fact said is not kept in a
 * conversation's summary, nor found again through the keys a later rewrite would make of it. The
 * coverage stays: the next rewrite starts after it, and never folds a marked message (summary.ts).
 * A rewrite under way that read one is moot: its summary or its messages changed (summary.ts's
 * compare-and-set); one that committed before the mark is cleared here, after it; keys written
 * from a summary just cleared find it changed, or are swept by the delete after the clear.
 */
async function clearSummariesFolding(db: TenantDb, deps: VectorDeps, messageIds: string[], receipt: ForgetReceipt) {
  if (messageIds.length === 0) return;
  const tenantId = db.$tenantId();
  const folded = Prisma.sql`
    SELECT m."conversationId", min(m."seq") AS "seq" FROM "Message" m
    WHERE m."tenantId" = ${tenantId} AND m."id" = ANY(${messageIds}::text[])
    GROUP BY m."conversationId"`;
  // Two statements of one transaction (read committed): the revisions' delete takes its snapshot
  // once the clear holds the conversations' rows, so it sees the revision of a rewrite that
  // committed while the clear waited for them (which moved the summary on from one that folded a
  // marked message). In one statement that revision was not seen, and stayed.
  const [cleared, revisions] = await db.$transaction([
    db.$queryRaw<{ id: string }[]>`
      WITH "folded" AS (${folded}), "holding" AS (
        SELECT c."id" FROM "Conversation" c JOIN "folded" f ON f."conversationId" = c."id"
        WHERE c."tenantId" = ${tenantId} AND c."summary" IS NOT NULL AND c."summaryThroughSeq" >= f."seq"
        ORDER BY c."id"
        FOR NO KEY UPDATE OF c
      )
      UPDATE "Conversation" c SET "summary" = NULL FROM "holding" h WHERE c."id" = h."id"
      RETURNING c."id"`,
    db.$executeRaw`
      DELETE FROM "SummaryRevision" r USING (${folded}) f
      WHERE r."tenantId" = ${tenantId} AND r."conversationId" = f."conversationId" AND r."coveredThroughSeq" >= f."seq"`,
  ]);
  receipt.summaries += cleared.length;
  receipt.summaryRevisions += revisions;
  if (cleared.length) {
    receipt.snippets += await forgetSnippetsWhere(db, deps, { kind: "SUMMARY", conversationId: { in: cleared.map((c) => c.id) } });
  }
}

const BATCH = 500;

/**
 * The retention window: recall snippets (rows and vectors) of moments before the cutoff, and
 * facts not confirmed since it. A fact the user restates has been refreshed and stays.
 */
export async function forgetExpired(db: TenantDb, deps: ForgetDeps, cutoff: Date, reason: string) {
  let facts = 0;
  for (;;) {
    const batch = await db.fact.findMany({
      where: { confirmedAt: { lt: cutoff } },
      select: { id: true, endUserId: true },
      take: BATCH,
    });
    if (batch.length === 0) break;
    const deleted = await deleteFacts(db, deps, batch.map((f) => f.id), { confirmedAt: { lt: cutoff } });
    facts += deleted.facts;
    // A fact the user restated since the batch was read stays, and is not announced.
    const gone = new Set(deleted.factIds);
    for (const fact of batch.filter((f) => gone.has(f.id))) {
      deps.pubsub.publish("factChanged", db.$tenantId(), {
        endUserId: fact.endUserId,
        factId: fact.id,
        change: "DELETED",
        reason,
        text: null,
        conversationId: null,
      });
    }
  }
  let snippets = 0;
  for (;;) {
    const ids = (await db.recallSnippet.findMany({ where: { occurredAt: { lt: cutoff } }, select: { id: true }, take: BATCH })).map(
      (s) => s.id,
    );
    if (ids.length === 0) break;
    snippets += await forgetSnippets(db, deps, ids);
  }
  // Vectors whose rows went without them (a crash mid-forget) go by their own timestamp.
  await deleteVectors(deps, db.$tenantId(), { occurredBefore: cutoff });
  // The gate's stored verdicts (a message's hash, the phrases it asked to forget) serve its turn's
  // work and that work's retries, days at most: none is kept past the window, but a conversation
  // with a turn still to judge keeps its own (a worker down for days must not lose a caller's).
  const verdicts = await db.$executeRaw`
    DELETE FROM "GateVerdict" v
    WHERE v."tenantId" = ${db.$tenantId()} AND v."createdAt" < ${cutoff}
      AND NOT EXISTS (SELECT 1 FROM "Turn" t WHERE t."conversationId" = v."conversationId" AND t."gatedAt" IS NULL)`;
  return { facts, snippets, verdicts };
}

export type ForgetRecord = { id: string; at: Date; apiKeyId: string | null; kind: string; receipt: ForgetReceipt };

/** The audited forgets of one user, newest first: who asked, when, what kinds and how many (never content). */
export async function forgetRecords(db: TenantDb, endUserId: string): Promise<ForgetRecord[]> {
  const rows = await db.auditLog.findMany({
    where: { action: "memory.forget", changes: { path: ["target", "endUserId"], equals: endUserId } },
    orderBy: { createdAt: "desc" },
    take: 100,
  });
  return rows.map((row) => {
    const changes = row.changes as { target: { kind: string }; receipt: Partial<ForgetReceipt> };
    return { id: row.id, at: row.createdAt, apiKeyId: row.apiKeyId, kind: changes.target.kind, receipt: { ...emptyReceipt(), ...changes.receipt } };
  });
}
