import { isDeepStrictEqual } from "node:util";
import { z } from "zod";
import type { TenantDb } from "../../db.ts";
import type { Deps } from "../../deps.ts";
import type { EntryChange } from "../../pubsub.ts";
import { notFound, parseInput } from "../../errors.ts";
import { Prisma, type MemoryEntry } from "../../generated/prisma/client.ts";
import { LIMITS, scopeRefSchema, scopeSchema, tagsSchema } from "../../limits.ts";
import { lexemeQuery } from "../text-search.ts";

const entryFields = {
  title: z
    .string()
    .trim()
    .min(1)
    .max(LIMITS.titleMax)
    .refine((title) => !title.includes("\n"), "must be one line"),
  summary: z.string().min(1).max(LIMITS.summaryMaxChars),
  tags: tagsSchema,
  importance: z.number().int().min(1).max(5),
  source: z.enum(["CHAT", "CALL", "EMAIL", "MANUAL", "COMPACTOR"]),
};

export const createEntryInput = z.object({
  scope: scopeSchema,
  scopeRef: scopeRefSchema,
  ...entryFields,
  tags: entryFields.tags.nullish().transform((tags) => tags ?? []),
  importance: entryFields.importance.nullish().transform((importance) => importance ?? 3),
  source: entryFields.source.nullish().transform((source) => source ?? "MANUAL"),
});

// A correction changes the content; the scope of an entry is part of its identity.
export const correctEntryInput = z
  .object({
    title: entryFields.title.nullish(),
    summary: entryFields.summary.nullish(),
    tags: entryFields.tags.nullish(),
    importance: entryFields.importance.nullish(),
  })
  .transform((input) =>
    Object.fromEntries(Object.entries(input).filter(([, value]) => value != null)),
  );

export type EntryDeps = Pick<Deps, "pubsub">;

/** Every change of an entry is announced here, whoever made it (a person, a skill, the compactor). */
export function announceEntry(db: TenantDb, deps: EntryDeps, change: EntryChange, entry: Pick<MemoryEntry, "id" | "scope" | "scopeRef">) {
  deps.pubsub.publish("entryChanged", db.$tenantId(), { id: entry.id, scope: entry.scope, scopeRef: entry.scopeRef, change });
}

export async function createEntry(db: TenantDb, deps: EntryDeps, input: z.input<typeof createEntryInput>) {
  const entry = await db.memoryEntry.create({ data: { ...parseInput(createEntryInput, input), tenantId: db.$tenantId() } });
  announceEntry(db, deps, "CREATED", entry);
  return entry;
}

export async function correctEntry(
  db: TenantDb,
  deps: EntryDeps,
  id: string,
  input: z.input<typeof correctEntryInput>,
): Promise<MemoryEntry> {
  const data = parseInput(correctEntryInput, input);
  // Saving it unchanged (or with nothing given) changes nothing: no new updatedAt, no CORRECTED
  // announced to the entry's subscribers.
  const stored = await db.memoryEntry.findUnique({ where: { id } });
  if (!stored) throw notFound("Entry", id);
  if (Object.entries(data).every(([field, value]) => isDeepStrictEqual(stored[field as keyof MemoryEntry], value))) return stored;
  const { count } = await db.memoryEntry.updateMany({ where: { id }, data });
  if (count === 0) throw notFound("Entry", id);
  const entry = await db.memoryEntry.findUniqueOrThrow({ where: { id } });
  announceEntry(db, deps, "CORRECTED", entry);
  return entry;
}

/** Deletes an entry; events folded into it keep existing and lose the link. */
export async function forgetEntry(db: TenantDb, deps: EntryDeps, id: string): Promise<MemoryEntry> {
  const entry = await db.memoryEntry.findUnique({ where: { id } });
  if (!entry) throw notFound("Entry", id);
  await db.memoryEntry.deleteMany({ where: { id } });
  announceEntry(db, deps, "FORGOTTEN", entry);
  return entry;
}

export const searchEntriesInput = z.object({
  scope: scopeSchema.nullish(),
  scopeRef: scopeRefSchema.nullish(),
  tags: tagsSchema.nullish(),
  search: z.string().trim().max(1_000).nullish(),
});

export type EntryFilter = z.input<typeof searchEntriesInput>;

export function entriesWhere(filter: EntryFilter): Prisma.MemoryEntryWhereInput {
  const { scope, scopeRef, tags } = parseInput(searchEntriesInput, filter);
  return {
    ...(scope ? { scope } : {}),
    ...(scopeRef ? { scopeRef } : {}),
    ...(tags?.length ? { tags: { hasEvery: tags } } : {}),
  };
}

/**
 * Ids of the entries matching a full-text search, best first: PostgreSQL ts_rank_cd over the
 * weighted title (A) and summary (B), nudged up by importance.
 */
export async function searchEntryIds(
  db: TenantDb,
  filter: EntryFilter,
  page: { offset: number; limit: number },
): Promise<string[]> {
  const { scope, scopeRef, tags, search } = parseInput(searchEntriesInput, filter);
  if (!search) return [];
  const conditions = [
    Prisma.sql`e."tenantId" = ${db.$tenantId()}`,
    Prisma.sql`e."search" @@ q`,
    ...(scope ? [Prisma.sql`e."scope" = ${scope}::"Scope"`] : []),
    ...(scopeRef ? [Prisma.sql`e."scopeRef" = ${scopeRef}`] : []),
    ...(tags?.length ? [Prisma.sql`e."tags" @> ${tags}::text[]`] : []),
  ];
  const rows = await db.$queryRaw<{ id: string }[]>`
    SELECT e."id"
    FROM "MemoryEntry" e, websearch_to_tsquery('english', ${search}) q
    WHERE ${Prisma.join(conditions, " AND ")}
    ORDER BY ts_rank_cd(e."search", q) * (1 + e."importance" / 10.0) DESC, e."updatedAt" DESC, e."id"
    LIMIT ${page.limit} OFFSET ${page.offset}`;
  return rows.map((row) => row.id);
}

/**
 * The entries most relevant to a message, for context assembly: any of its words may match
 * (an OR of its lexemes), within the end user's own scope (ENTITY under their external id, as
 * forgetUser and exportUser read it), the agent's (PROJECT or TEAM under its external id) and
 * the institutional scope. A ref is matched with its scope: an agent and a user may share an id.
 */
export async function relevantEntries(
  db: TenantDb,
  input: { text: string; agentExternalId: string; endUserExternalId: string; limit: number },
): Promise<MemoryEntry[]> {
  // The rows themselves, in one statement: context waits on it (on the embedded store a second
  // statement to read them by id was about 3 ms of a context query's 19).
  return db.$queryRaw<MemoryEntry[]>`
    WITH q AS (SELECT ${lexemeQuery(input.text, "|")} AS q)
    SELECT e."id", e."tenantId", e."scope"::text AS "scope", e."scopeRef", e."title", e."summary", e."tags", e."importance",
           e."source"::text AS "source", e."createdAt", e."updatedAt"
    FROM "MemoryEntry" e, q
    WHERE e."tenantId" = ${db.$tenantId()}
      AND (e."scope" = 'INSTITUTIONAL'::"Scope"
           OR (e."scope" = 'ENTITY'::"Scope" AND e."scopeRef" = ${input.endUserExternalId})
           OR (e."scope" IN ('PROJECT'::"Scope", 'TEAM'::"Scope") AND e."scopeRef" = ${input.agentExternalId}))
      AND q.q IS NOT NULL AND e."search" @@ q.q
    ORDER BY ts_rank_cd(e."search", q.q) * (1 + e."importance" / 10.0) DESC, e."updatedAt" DESC
    LIMIT ${input.limit}`;
}
