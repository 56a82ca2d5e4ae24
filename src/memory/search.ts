import { z } from "zod";
import type { TenantDb } from "../db.ts";
import { parseInput } from "../errors.ts";
import { Prisma } from "../generated/prisma/client.ts";

export const MEMORY_KINDS = ["FACT", "ENTRY", "EVENT", "SNIPPET"] as const;
export type MemoryKind = (typeof MEMORY_KINDS)[number];

export const searchMemoryInput = z.object({
  text: z.string().trim().min(2).max(200),
  endUserId: z.string().min(1).nullish(),
  agentId: z.string().min(1).nullish(),
  kinds: z.array(z.enum(MEMORY_KINDS)).max(MEMORY_KINDS.length).nullish(),
  since: z.date().nullish(),
  until: z.date().nullish(),
  first: z.number().int().min(1).max(100).nullish().transform((v) => v ?? 30),
});

/** One match, with the ids of where it lives so a reader can open its source. */
export type MemoryHit = {
  kind: MemoryKind;
  id: string;
  rank: number;
  /** When the user said it (facts: last confirmed), the event happened, or the entry was last updated. */
  at: Date;
  title: string | null;
  text: string;
  endUserId: string | null;
  /** The user's display name, else their own id. */
  endUserName: string | null;
  conversationId: string | null;
  conversationName: string | null;
  /** For a fact, the message it was extracted from; for a snippet, its first message. */
  messageId: string | null;
  messageSeq: number | null;
  scope: string | null;
  scopeRef: string | null;
};

type Row = Omit<MemoryHit, "kind" | "rank"> & { rank: number | string };

// LIKE's own wildcards in the person's text are literal characters.
const likePattern = (text: string) => `%${text.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;

/**
 * Facts, entries, events and recall snippets matching a text, across the tenant's users, best
 * first. A match holds every English word of the text (stemmed, ranked by ts_rank, through GIN
 * indexes); a text with no such word (stop words, punctuation, `%%`) is matched as typed. By user: their facts and snippets, and entries and events whose scopeRef
 * is their own id. By agent: facts of the users it talks with and snippets of its conversations
 * (entries and events belong to no agent, so they are left out).
 */
export async function searchMemory(db: TenantDb, input: z.input<typeof searchMemoryInput>): Promise<MemoryHit[]> {
  const filter = parseInput(searchMemoryInput, input);
  const tenantId = db.$tenantId();
  const kinds = new Set<MemoryKind>(filter.kinds?.length ? filter.kinds : MEMORY_KINDS);
  if (filter.agentId) {
    kinds.delete("ENTRY");
    kinds.delete("EVENT");
  }
  const like = likePattern(filter.text);
  const q = Prisma.sql`websearch_to_tsquery('english', ${filter.text})`;
  const range = (column: Prisma.Sql) => [
    ...(filter.since ? [Prisma.sql`${column} >= ${filter.since}`] : []),
    ...(filter.until ? [Prisma.sql`${column} < ${filter.until}`] : []),
  ];
  // One statement: whether the text has words to search by, and the chosen user's own id.
  const [{ words, externalId }] = await db.$queryRaw<{ words: boolean; externalId: string | null }[]>`
    SELECT numnode(${q}) > 0 AS "words",
           (SELECT u."externalId" FROM "EndUser" u WHERE u."id" = ${filter.endUserId ?? null} AND u."tenantId" = ${tenantId}) AS "externalId"`;
  // An unknown user matches nothing (and says nothing about other tenants' ids).
  if (filter.endUserId && externalId === null) return [];
  const user = externalId === null ? null : { externalId };
  const matches = (vector: Prisma.Sql, ...columns: Prisma.Sql[]) =>
    words ? Prisma.sql`${vector} @@ ${q}` : Prisma.sql`(${Prisma.join(columns.map((c) => Prisma.sql`${c} ILIKE ${like}`), " OR ")})`;
  const rank = (vector: Prisma.Sql) => (words ? Prisma.sql`ts_rank(${vector}, ${q}) + 0.01` : Prisma.sql`0.01`);
  const limit = filter.first;
  const queries: Promise<MemoryHit[]>[] = [];
  const run = (kind: MemoryKind, rows: Promise<Row[]>) =>
    queries.push(rows.then((found) => found.map((row) => ({ ...row, kind, rank: Number(row.rank), at: new Date(row.at) }))));

  if (kinds.has("FACT")) {
    const vector = Prisma.sql`f."search"`;
    const where = [
      Prisma.sql`f."tenantId" = ${tenantId}`,
      matches(vector, Prisma.sql`f."text"`),
      ...(filter.endUserId ? [Prisma.sql`f."endUserId" = ${filter.endUserId}`] : []),
      ...(filter.agentId
        ? [Prisma.sql`EXISTS (SELECT 1 FROM "Conversation" a WHERE a."tenantId" = ${tenantId} AND a."endUserId" = f."endUserId" AND a."agentId" = ${filter.agentId})`]
        : []),
      ...range(Prisma.sql`f."confirmedAt"`),
    ];
    run("FACT", db.$queryRaw<Row[]>`
      SELECT f."id", ${rank(vector)} AS "rank", f."confirmedAt" AS "at", NULL AS "title", f."text",
             f."endUserId", coalesce(u."displayName", u."externalId") AS "endUserName",
             m."conversationId", c."externalId" AS "conversationName", f."sourceMessageId" AS "messageId", m."seq" AS "messageSeq",
             NULL AS "scope", NULL AS "scopeRef"
      FROM "Fact" f
      JOIN "EndUser" u ON u."id" = f."endUserId"
      LEFT JOIN "Message" m ON m."id" = f."sourceMessageId" AND m."tenantId" = ${tenantId}
      LEFT JOIN "Conversation" c ON c."id" = m."conversationId"
      WHERE ${Prisma.join(where, " AND ")}
      ORDER BY 2 DESC, 3 DESC LIMIT ${limit}`);
  }
  if (kinds.has("SNIPPET")) {
    const where = [
      Prisma.sql`s."tenantId" = ${tenantId}`,
      // A FACT snippet is a fact's sentence again: the fact itself is the hit.
      Prisma.sql`s."kind" <> 'FACT'::"SnippetKind"`,
      matches(Prisma.sql`s."search"`, Prisma.sql`s."text"`),
      ...(filter.endUserId ? [Prisma.sql`s."endUserId" = ${filter.endUserId}`] : []),
      ...(filter.agentId
        ? [Prisma.sql`c."agentId" = ${filter.agentId}`]
        : []),
      ...range(Prisma.sql`s."occurredAt"`),
    ];
    run("SNIPPET", db.$queryRaw<Row[]>`
      SELECT s."id", ${rank(Prisma.sql`s."search"`)} AS "rank", s."occurredAt" AS "at", NULL AS "title", s."text",
             s."endUserId", coalesce(u."displayName", u."externalId") AS "endUserName",
             s."conversationId", c."externalId" AS "conversationName", s."messageIds"[1] AS "messageId", m."seq" AS "messageSeq",
             NULL AS "scope", NULL AS "scopeRef"
      FROM "RecallSnippet" s
      JOIN "EndUser" u ON u."id" = s."endUserId"
      JOIN "Conversation" c ON c."id" = s."conversationId"
      LEFT JOIN "Message" m ON m."id" = s."messageIds"[1] AND m."tenantId" = ${tenantId}
      WHERE ${Prisma.join(where, " AND ")}
      ORDER BY 2 DESC, 3 DESC LIMIT ${limit}`);
  }
  if (kinds.has("ENTRY")) {
    const where = [
      Prisma.sql`e."tenantId" = ${tenantId}`,
      matches(Prisma.sql`e."search"`, Prisma.sql`e."title"`, Prisma.sql`e."summary"`),
      // The person's own scope (aboutThePerson): a team or agent that shares the id is another.
      ...(user ? [Prisma.sql`e."scope" = 'ENTITY' AND e."scopeRef" = ${user.externalId}`] : []),
      ...range(Prisma.sql`e."updatedAt"`),
    ];
    run("ENTRY", db.$queryRaw<Row[]>`
      SELECT e."id", ${rank(Prisma.sql`e."search"`)} AS "rank", e."updatedAt" AS "at", e."title", e."summary" AS "text",
             NULL AS "endUserId", NULL AS "endUserName", NULL AS "conversationId", NULL AS "conversationName",
             NULL AS "messageId", NULL::int AS "messageSeq", e."scope"::text AS "scope", e."scopeRef"
      FROM "MemoryEntry" e
      WHERE ${Prisma.join(where, " AND ")}
      ORDER BY 2 DESC, 3 DESC LIMIT ${limit}`);
  }
  if (kinds.has("EVENT")) {
    const vector = Prisma.sql`v."search"`;
    const where = [
      Prisma.sql`v."tenantId" = ${tenantId}`,
      matches(vector, Prisma.sql`v."body"`),
      ...(user ? [Prisma.sql`v."scope" = 'ENTITY' AND v."scopeRef" = ${user.externalId}`] : []),
      ...range(Prisma.sql`v."occurredAt"`),
    ];
    run("EVENT", db.$queryRaw<Row[]>`
      SELECT v."id", ${rank(vector)} AS "rank", v."occurredAt" AS "at", v."kind" AS "title", v."body" AS "text",
             NULL AS "endUserId", NULL AS "endUserName", NULL AS "conversationId", NULL AS "conversationName",
             NULL AS "messageId", NULL::int AS "messageSeq", v."scope"::text AS "scope", v."scopeRef"
      FROM "MemoryEvent" v
      WHERE ${Prisma.join(where, " AND ")}
      ORDER BY 2 DESC, 3 DESC LIMIT ${limit}`);
  }

  const hits = (await Promise.all(queries)).flat();
  return hits
    .sort((a, b) => b.rank - a.rank || b.at.getTime() - a.at.getTime() || a.id.localeCompare(b.id))
    .slice(0, limit);
}
