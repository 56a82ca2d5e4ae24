import type { Writable } from "node:stream";
import { sqlTimestamp, type TenantDb } from "../db.ts";
import { EngramError, notFound } from "../errors.ts";
import { Prisma } from "../generated/prisma/client.ts";
import { LIMITS } from "../limits.ts";

/**
 * What the log holds about a person as an entity: scope ENTITY under their own external id (a
 * skill's notes on them). A team, project or agent that shares the id is another scope. The
 * export lists these entries; forgetting the person deletes them, their events and feed rows.
 */
export const aboutThePerson = (externalId: string) => ({ scope: "ENTITY" as const, scopeRef: externalId });

/** Where an export of any size is streamed from (src/export-http.ts serves it): GET, admin keys. */
export const EXPORT_PATH = "/export/users";
const exportPathOf = (endUserId: string) => `${EXPORT_PATH}/${encodeURIComponent(endUserId)}`;

/**
 * Rows of a list read per page. A message may hold 32,000 characters: 500 of them are at most
 * about 32 MB in memory at once, however long the history.
 */
const EXPORT_PAGE = 500;

/** A list of the export read as it is written, a page at a time; an array in the document. */
type Rows = AsyncIterable<unknown>;

const isRows = (value: unknown): value is Rows => value != null && typeof value === "object" && Symbol.asyncIterator in value;

/** A plain object with a list of rows among its own values: written key by key, the rows as they come. */
const holdsRows = (value: unknown): value is Record<string, unknown> =>
  value != null && Object.getPrototypeOf(value) === Object.prototype && Object.values(value).some(isRows);

type EndUser = { id: string; externalId: string; displayName: string | null; createdAt: Date };

/** Each page starts after the last row of the one before (keyset). */
async function* pagesOf<T>(readPage: (after: T | undefined) => Promise<T[]>): AsyncGenerator<T[]> {
  let after: T | undefined;
  for (;;) {
    const page = await readPage(after);
    if (page.length) yield page;
    if (page.length < EXPORT_PAGE) return;
    after = page[page.length - 1];
  }
}

async function* inPages<T>(pages: AsyncIterable<T[]>): AsyncGenerator<T> {
  for await (const page of pages) yield* page;
}

/**
 * A list of a person's rows read in the order (time, id): its table (`t` in `columns`), the
 * columns that pick its rows, its time column and direction, and what each row holds, as the
 * export writes it (the time column and id among them). Migration 0017 indexes each list on
 * (tenantId and those columns, time, id), or (conversationId, time, id) for revisions.
 */
export type KeysetList = {
  table: "Conversation" | "RecallSnippet" | "MemoryEntry" | "MemoryEvent" | "SummaryRevision";
  where: Record<string, string>;
  time: "createdAt" | "occurredAt";
  direction: "asc" | "desc";
  columns: Prisma.Sql;
};

const column = (name: string) => Prisma.raw(`t."${name}"`);

/**
 * The statement for the page after `after`. Its row comparison `(time, id) > (…)` bounds the scan
 * of the list's index, so a page reads its own rows only. Prisma's where can only say it as
 * `time > … OR (time = … AND id > …)`, which PostgreSQL checks row by row from the person's first
 * row: each page read all the rows of the pages before it.
 */
export function nextPage(db: TenantDb, list: KeysetList, after?: { id: string; at: Date }): Prisma.Sql {
  const [beyond, order] = list.direction === "asc" ? [">", "ASC"] : ["<", "DESC"];
  const conditions = Object.entries({ tenantId: db.$tenantId(), ...list.where }).map(([name, value]) => Prisma.sql`${column(name)} = ${value}`);
  if (after) conditions.push(Prisma.sql`(${column(list.time)}, t."id") ${Prisma.raw(beyond)} (${sqlTimestamp(after.at)}, ${after.id})`);
  return Prisma.sql`SELECT ${list.columns} FROM ${Prisma.raw(`"${list.table}"`)} AS t
    WHERE ${Prisma.join(conditions, " AND ")}
    ORDER BY ${column(list.time)} ${Prisma.raw(order)}, t."id" ${Prisma.raw(order)} LIMIT ${EXPORT_PAGE}`;
}

/** A list's rows a page at a time, each page starting after the last row of the one before. */
function keysetPages<T extends { id: string }>(db: TenantDb, list: KeysetList): AsyncGenerator<T[]> {
  return pagesOf((after?: T) => db.$queryRaw<T[]>(nextPage(db, list, after && { id: after.id, at: (after as Record<string, unknown>)[list.time] as Date })));
}

// A summary revision's fields in the export, in its order: read by Prisma for a conversation's few
// revisions, and by keysetLists.revisions for one whose revisions are paged.
const REVISION_FIELDS = { text: true, accepted: true, reason: true, createdAt: true } as const;

type ConversationRow = { id: string; externalId: string; createdAt: Date; lastSeq: number; summary: string | null; agent: { externalId: string; name: string } };
type Row = { id: string } & Record<string, unknown>;

/** The lists an export reads by (time, id), with the fields it writes of each, in its order. */
export const keysetLists = {
  conversations: (endUserId: string): KeysetList => ({
    table: "Conversation",
    where: { endUserId },
    time: "createdAt",
    direction: "asc",
    columns: Prisma.sql`t."id", t."externalId", t."createdAt", t."lastSeq", t."summary",
      (SELECT json_build_object('externalId', a."externalId", 'name', a."name") FROM "Agent" a WHERE a."id" = t."agentId") AS "agent"`,
  }),
  revisions: (conversationId: string): KeysetList => ({
    table: "SummaryRevision",
    where: { conversationId },
    time: "createdAt",
    direction: "asc",
    columns: Prisma.join(["id", ...Object.keys(REVISION_FIELDS)].map(column)),
  }),
  snippets: (endUserId: string): KeysetList => ({
    table: "RecallSnippet",
    where: { endUserId },
    time: "occurredAt",
    direction: "asc",
    columns: Prisma.sql`t."id", t."kind"::text AS "kind", t."text", t."conversationId", t."occurredAt"`,
  }),
  // Newest first by creation, which no correction moves (updatedAt does: a page could skip an entry corrected meanwhile).
  entries: (externalId: string): KeysetList => ({
    table: "MemoryEntry",
    where: aboutThePerson(externalId),
    time: "createdAt",
    direction: "desc",
    columns: Prisma.sql`t."id", t."scope"::text AS "scope", t."scopeRef", t."title", t."summary", t."tags", t."importance", t."source"::text AS "source", t."createdAt", t."updatedAt"`,
  }),
  events: (externalId: string): KeysetList => ({
    table: "MemoryEvent",
    where: aboutThePerson(externalId),
    time: "occurredAt",
    direction: "asc",
    columns: Prisma.sql`t."id", t."scope"::text AS "scope", t."scopeRef", t."kind", t."body", t."source", t."sourceRef", t."occurredAt"`,
  }),
};

export async function findEndUser(db: TenantDb, endUserId: string): Promise<EndUser> {
  const user = await db.endUser.findUnique({ where: { id: endUserId }, select: { id: true, externalId: true, displayName: true, createdAt: true } });
  if (!user) throw notFound("End user", endUserId);
  return user;
}

/**
 * The person `engram export-user <name>` means: the one with that external id, as its usage says;
 * only when none has it, the one with that id. An external id is the caller's to choose, so one
 * may spell another person's id: matching either at once let such a user's export be another's.
 */
export async function endUserNamed(db: TenantDb, name: string): Promise<EndUser | null> {
  const select = { id: true, externalId: true, displayName: true, createdAt: true } as const;
  return (
    (await db.endUser.findFirst({ where: { externalId: name }, select })) ??
    (await db.endUser.findUnique({ where: { id: name }, select }))
  );
}

const MESSAGE_FIELDS = { seq: true, role: true, content: true, private: true, occurredAt: true, forgottenAt: true } as const;

function pagedRevisions(db: TenantDb, conversationId: string) {
  return withoutIds(
    inPages(keysetPages<Row>(db, keysetLists.revisions(conversationId))),
  );
}

/** A long conversation's revisions and messages, each read a page at a time. */
function pagedHistory(db: TenantDb, conversationId: string) {
  const messages = inPages(
    pagesOf((after?: { seq: number }) =>
      db.message.findMany({
        where: { conversationId, ...(after && { seq: { gt: after.seq } }) },
        orderBy: { seq: "asc" },
        take: EXPORT_PAGE,
        select: MESSAGE_FIELDS,
      }),
    ),
  );
  return { revisions: pagedRevisions(db, conversationId), messages };
}

/** Rows by their conversation, in their order, without the conversation's id. */
function byConversation<T extends { conversationId: string }>(rows: T[]): Map<string, Omit<T, "conversationId">[]> {
  const grouped = new Map<string, Omit<T, "conversationId">[]>();
  for (const { conversationId, ...row } of rows) {
    let list = grouped.get(conversationId);
    if (!list) grouped.set(conversationId, (list = []));
    list.push(row);
  }
  return grouped;
}

/**
 * The revisions and messages of short conversations, read together: a query each, not two a
 * conversation (a support bot's user may have thousands of short ones). Their messages fit a
 * page (the caller sums their lastSeq); when their revisions do not, each conversation's are paged.
 */
async function historiesTogether(db: TenantDb, ids: string[]) {
  const [messages, revisions] = await Promise.all([
    db.message.findMany({
      where: { conversationId: { in: ids } },
      orderBy: [{ conversationId: "asc" }, { seq: "asc" }],
      select: { conversationId: true, ...MESSAGE_FIELDS },
    }),
    db.summaryRevision.findMany({
      where: { conversationId: { in: ids } },
      orderBy: [{ conversationId: "asc" }, { createdAt: "asc" }, { id: "asc" }],
      take: EXPORT_PAGE + 1,
      select: { conversationId: true, ...REVISION_FIELDS },
    }),
  ]);
  const messagesOf = byConversation(messages);
  const revisionsOf = revisions.length > EXPORT_PAGE ? null : byConversation(revisions);
  return (id: string) => ({ revisions: revisionsOf ? (revisionsOf.get(id) ?? []) : pagedRevisions(db, id), messages: messagesOf.get(id) ?? [] });
}

/** A page of conversations in runs whose messages (lastSeq at most each) fit one page together; a longer one is a run alone. */
function runsOfAPage<T extends { lastSeq: number }>(conversations: T[]): { run: T[]; fits: boolean }[] {
  const runs: { run: T[]; fits: boolean }[] = [];
  let run: T[] = [];
  let size = 0;
  for (const conversation of conversations) {
    if (run.length && size + conversation.lastSeq > EXPORT_PAGE) {
      runs.push({ run, fits: size <= EXPORT_PAGE });
      run = [];
      size = 0;
    }
    run.push(conversation);
    size += conversation.lastSeq;
  }
  if (run.length) runs.push({ run, fits: size <= EXPORT_PAGE });
  return runs;
}

async function* conversationsOf(db: TenantDb, endUserId: string) {
  const pages = keysetPages<ConversationRow>(db, keysetLists.conversations(endUserId));
  for await (const page of pages) {
    for (const { run, fits } of runsOfAPage(page)) {
      const historyOf = fits ? await historiesTogether(db, run.map((conversation) => conversation.id)) : (id: string) => pagedHistory(db, id);
      for (const conversation of run) yield { ...conversation, ...historyOf(conversation.id) };
    }
  }
}

/** Rows whose id served only as the key of their pages. */
async function* withoutIds(rows: AsyncIterable<{ id: string }>) {
  for await (const { id: _, ...row } of rows) yield row;
}

/**
 * Everything Engram holds about one person: the right-of-access twin of forgetting. Facts with
 * their history, each conversation with its messages (those forgotten but kept as a record too,
 * marked), its summary and revisions, the recall snippets' text, and the events and curated
 * entries about them as an entity (aboutThePerson). Nothing is read yet: each list is read a
 * page at a time as it is written (writeExport) or gathered (exportUser). Not a snapshot: a turn
 * recorded meanwhile may or may not be in it, but no row is read twice or skipped.
 */
export function userExport(db: TenantDb, user: EndUser) {
  const endUserId = user.id;
  return {
    exportedAt: new Date().toISOString(),
    endUser: { id: user.id, externalId: user.externalId, displayName: user.displayName, createdAt: user.createdAt },
    // At most 50 live facts a user (SPEC §5): read at once, with their history.
    facts: (async function* () {
      const facts = await db.fact.findMany({
        where: { endUserId },
        orderBy: [{ core: "desc" }, { confirmedAt: "desc" }, { id: "asc" }],
        include: { versions: { orderBy: [{ createdAt: "asc" }, { id: "asc" }], select: { text: true, core: true, change: true, reason: true, createdAt: true } } },
      });
      for (const { tenantId: _t, ...fact } of facts) yield fact;
    })(),
    conversations: conversationsOf(db, endUserId),
    snippets: inPages(keysetPages<Row>(db, keysetLists.snippets(endUserId))),
    entries: inPages(keysetPages<Row>(db, keysetLists.entries(user.externalId))),
    events: inPages(keysetPages<Row>(db, keysetLists.events(user.externalId))),
  };
}

/** The rows an export holds: conversations, messages, summary revisions, snippets, fact versions, entries and events (live facts are at most 50, each with its versions). */
export async function historyRows(db: TenantDb, user: EndUser): Promise<number> {
  const counts = await Promise.all([
    db.conversation.count({ where: { endUserId: user.id } }),
    db.message.count({ where: { conversation: { endUserId: user.id } } }),
    db.summaryRevision.count({ where: { conversation: { endUserId: user.id } } }),
    db.recallSnippet.count({ where: { endUserId: user.id } }),
    db.factVersion.count({ where: { fact: { endUserId: user.id } } }),
    db.memoryEntry.count({ where: aboutThePerson(user.externalId) }),
    db.memoryEvent.count({ where: aboutThePerson(user.externalId) }),
  ]);
  return counts.reduce((sum, count) => sum + count, 0);
}

/** Every list read into an array. */
async function gathered(value: unknown): Promise<unknown> {
  if (isRows(value)) {
    const items: unknown[] = [];
    for await (const item of value) items.push(await gathered(item));
    return items;
  }
  if (!holdsRows(value)) return value;
  const entries: [string, unknown][] = [];
  for (const [key, field] of Object.entries(value)) entries.push([key, await gathered(field)]);
  return Object.fromEntries(entries);
}

/** How an export was asked for, for its audit row: the key (none from the CLI) and the way. */
export type ExportWho = { apiKeyId: string | null; via: "graphql" | "stream" | "cli" };

/**
 * Records who exported whose data (action `memory.export`) before the first row is read: a right
 * of access is also a way out for a person's data, and an operator must be able to tell who took it.
 */
export async function auditExport(db: TenantDb, user: EndUser, who: ExportWho) {
  await db.auditLog.create({
    data: {
      tenantId: db.$tenantId(),
      apiKeyId: who.apiKeyId,
      action: "memory.export",
      changes: { target: { endUserId: user.id, externalId: user.externalId }, via: who.via },
    },
  });
}

/**
 * The export as one JSON value, for a person whose history fits one answer: above
 * LIMITS.exportRowsMax rows (counted first, nothing else read) it is EXPORT_TOO_LARGE, naming
 * the streaming path that takes any size.
 */
export async function exportUser(db: TenantDb, endUserId: string, who: ExportWho) {
  const user = await findEndUser(db, endUserId);
  const rows = await historyRows(db, user);
  if (rows > LIMITS.exportRowsMax) {
    const path = exportPathOf(user.id);
    throw new EngramError(
      "EXPORT_TOO_LARGE",
      `End user ${user.id} has ${rows} rows (conversations, messages, summary revisions, snippets, fact versions, entries and events), over the ${LIMITS.exportRowsMax} one answer holds: stream the export with GET ${path} (an admin key).`,
      { rows, limit: LIMITS.exportRowsMax, path },
    );
  }
  await auditExport(db, user, who);
  return gathered(userExport(db, user)) as Promise<Record<string, unknown>>;
}

/** Text handed to the stream at once: few writes, and a small buffer. */
const CHUNK_CHARS = 64 * 1024;

/** The stream an export was written to closed before the end (the client went away). */
export class ExportAborted extends Error {
  constructor() {
    super("the export's reader went away before its end");
    this.name = "ExportAborted";
  }
}

/** Resolves once `out` takes writes again; rejects if it closes first (a 'drain' would never come). */
function drained(out: Writable): Promise<void> {
  return new Promise((resolve, reject) => {
    if (out.destroyed) return reject(new ExportAborted());
    const settle = (closed: boolean) => () => {
      out.off("drain", onDrain);
      out.off("close", onClose);
      if (closed) reject(new ExportAborted());
      else resolve();
    };
    const onDrain = settle(false);
    const onClose = settle(true);
    out.on("drain", onDrain);
    out.on("close", onClose);
  });
}

/**
 * Writes an export (userExport) to `out` as the JSON exportUser answers, reading each list a
 * page at a time: the next page is read only once `out` has taken what came before
 * (backpressure), so memory holds a page and a chunk, never the history. Leaves `out` open.
 * Throws ExportAborted when `out` closes first. `beforeWrite` runs before each chunk is written
 * and may throw to stop the export there (the streamed export's key revoked meanwhile).
 */
export async function writeExport(document: unknown, out: Writable, beforeWrite?: () => Promise<void>): Promise<void> {
  let chunk = "";
  const flush = async () => {
    if (out.destroyed || out.writableEnded) throw new ExportAborted();
    await beforeWrite?.();
    const text = chunk;
    chunk = "";
    if (!out.write(text)) await drained(out);
  };
  const write = async (text: string) => {
    chunk += text;
    if (chunk.length >= CHUNK_CHARS) await flush();
  };
  const writeValue = async (value: unknown): Promise<void> => {
    if (isRows(value)) {
      let first = true;
      await write("[");
      for await (const item of value) {
        if (!first) await write(",");
        first = false;
        await writeValue(item);
      }
      return write("]");
    }
    if (!holdsRows(value)) return write(JSON.stringify(value));
    let first = true;
    await write("{");
    for (const [key, field] of Object.entries(value)) {
      if (field === undefined) continue;
      await write(`${first ? "" : ","}${JSON.stringify(key)}:`);
      first = false;
      await writeValue(field);
    }
    return write("}");
  };
  await writeValue(document);
  await flush();
}
