import { queryFromInfo } from "@pothos/plugin-prisma";
import { resolveOffsetConnection } from "@pothos/plugin-relay";
import { filter, pipe } from "graphql-yoga";
import { builder, type GraphQLContext } from "../builder.ts";
import { badInput, notFound } from "../errors.ts";
import {
  correctEntry,
  createEntry,
  entriesWhere,
  forgetEntry,
  searchEntryIds,
} from "../memory/log/entries.ts";
import { LIMITS } from "../limits.ts";
import type { EntryChange as EntryChangeKind } from "../pubsub.ts";
import { EntrySourceEnum, ScopeEnum } from "./enums.ts";

/**
 * The list's page cursors, checked: Pothos reads an offset cursor's number with parseInt and
 * does not look at it, so a negative or non-numeric one went on to the statement. An empty page's
 * `endCursor` is offset -1 (Pothos issues it), which as `after` means from the start: a pager that
 * always passes the last `endCursor` back gets the list's first page, not an error.
 */
function checkedOffsetCursors<A extends { after?: string | null; before?: string | null }>(args: A): A {
  for (const [name, cursor] of [["after", args.after], ["before", args.before]] as const) {
    const issued = name === "after" ? /^OffsetConnection:(?:-1|\d{1,9})$/ : /^OffsetConnection:\d{1,9}$/;
    if (cursor != null && !issued.test(Buffer.from(cursor, "base64").toString("utf8"))) {
      throw badInput(`\`${name}\` is not a cursor of this list: pass a page's ${name === "after" ? "endCursor" : "startCursor"}.`);
    }
  }
  return args;
}

export const MemoryEntry = builder.prismaObject("MemoryEntry", {
  description: "A titled, tagged, scored summary: what context assembly and search read.",
  fields: (t) => ({
    id: t.exposeID("id"),
    scope: t.expose("scope", { type: ScopeEnum }),
    scopeRef: t.exposeString("scopeRef"),
    title: t.exposeString("title"),
    summary: t.exposeString("summary", { description: "Markdown." }),
    tags: t.exposeStringList("tags"),
    importance: t.exposeInt("importance", { description: "1 (trivia) to 5 (critical)." }),
    source: t.expose("source", { type: EntrySourceEnum }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    updatedAt: t.expose("updatedAt", { type: "DateTime" }),
    events: t.relatedConnection("events", {
      cursor: "id",
      description: "The events the compactor folded into this entry.",
      maxSize: LIMITS.pageMax,
      query: { orderBy: [{ occurredAt: "asc" }, { id: "asc" }] },
    }),
  }),
});

const CreateEntryInput = builder.inputType("CreateEntryInput", {
  fields: (t) => ({
    scope: t.field({ type: ScopeEnum, required: true }),
    scopeRef: t.string({ required: true }),
    title: t.string({ required: true, description: "One line, 1–200 characters." }),
    summary: t.string({ required: true, description: "Markdown." }),
    tags: t.stringList({ description: "At most 32 tags of at most 64 characters." }),
    importance: t.int({ description: "1–5, default 3." }),
    source: t.field({ type: EntrySourceEnum, description: "Default MANUAL." }),
  }),
});

const CorrectEntryInput = builder.inputType("CorrectEntryInput", {
  description: "Only the fields given change.",
  fields: (t) => ({
    title: t.string(),
    summary: t.string(),
    tags: t.stringList(),
    importance: t.int(),
  }),
});

export const EntryChangeKindEnum = builder.enumType("EntryChangeKind", {
  values: ["CREATED", "CORRECTED", "FORGOTTEN"] as const,
});

type EntryChangePayload = { id: string; scope: string; scopeRef: string; change: EntryChangeKind };

const EntryChange = builder.objectRef<EntryChangePayload>("EntryChange").implement({
  fields: (t) => ({
    change: t.field({ type: EntryChangeKindEnum, resolve: (p) => p.change }),
    entryId: t.exposeID("id"),
    scope: t.field({ type: ScopeEnum, resolve: (p) => p.scope as never }),
    scopeRef: t.exposeString("scopeRef"),
    entry: t.prismaField({
      type: "MemoryEntry",
      nullable: true,
      description: "The entry as a query would return it now; null once forgotten.",
      resolve: (query, p, _args, ctx) =>
        ctx.db.memoryEntry.findUnique({ ...query, where: { id: p.id } }),
    }),
  }),
});

builder.queryFields((t) => ({
  entry: t.prismaField({
    type: "MemoryEntry",
    authScopes: { reader: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (query, _root, { id }, ctx) => {
      const entry = await ctx.db.memoryEntry.findUnique({ ...query, where: { id: String(id) } });
      if (!entry) throw notFound("Entry", String(id));
      return entry;
    },
  }),
  entries: t.connection({
    type: MemoryEntry,
    authScopes: { reader: true },
    description:
      "Entries by scope, scopeRef and tags (all must match). With `search`, full-text ranked by " +
      "relevance over title and summary; otherwise most recently updated first.",
    args: {
      scope: t.arg({ type: ScopeEnum }),
      scopeRef: t.arg.string(),
      tags: t.arg.stringList(),
      tag: t.arg.string({ description: "One more tag that must match (REST's ?tag=)." }),
      search: t.arg.string(),
    },
    resolve: (_root, { tag, ...rest }, ctx, info) => {
      const args = tag ? { ...rest, tags: [...(rest.tags ?? []), tag] } : rest;
      const db = ctx.db;
      const query = queryFromInfo({ context: ctx, info, path: ["edges", "node"] });
      return resolveOffsetConnection({ args: checkedOffsetCursors(args), defaultSize: 20, maxSize: LIMITS.pageMax }, async (page) => {
        if (!args.search?.trim()) {
          return db.memoryEntry.findMany({
            ...query,
            where: entriesWhere(args),
            orderBy: [{ updatedAt: "desc" }, { id: "desc" }],
            skip: page.offset,
            take: page.limit,
          });
        }
        const ids = await searchEntryIds(db, args, page);
        const rows = await db.memoryEntry.findMany({ ...query, where: { id: { in: ids } } });
        const byId = new Map(rows.map((row) => [row.id, row]));
        return ids.flatMap((id) => byId.get(id) ?? []);
      });
    },
  }),
}));

builder.mutationFields((t) => ({
  createEntry: t.prismaField({
    type: "MemoryEntry",
    authScopes: { writer: true },
    args: { input: t.arg({ type: CreateEntryInput, required: true }) },
    resolve: async (query, _root, { input }, ctx) => {
      const entry = await createEntry(ctx.db, ctx.deps, input);
      return ctx.db.memoryEntry.findUniqueOrThrow({ ...query, where: { id: entry.id } });
    },
  }),
  correctEntry: t.prismaField({
    type: "MemoryEntry",
    authScopes: { writer: true },
    args: {
      id: t.arg.id({ required: true }),
      input: t.arg({ type: CorrectEntryInput, required: true }),
    },
    resolve: async (query, _root, { id, input }, ctx) => {
      const entry = await correctEntry(ctx.db, ctx.deps, String(id), input);
      return ctx.db.memoryEntry.findUniqueOrThrow({ ...query, where: { id: entry.id } });
    },
  }),
  forgetEntry: t.field({
    type: EntryChange,
    authScopes: { writer: true },
    description: "Deletes an entry for good. Events folded into it stay, unlinked.",
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, { id }, ctx) => {
      const entry = await forgetEntry(ctx.db, ctx.deps, String(id));
      return { id: entry.id, scope: entry.scope, scopeRef: entry.scopeRef, change: "FORGOTTEN" as const };
    },
  }),
}));

builder.subscriptionFields((t) => ({
  entryChanged: t.field({
    type: EntryChange,
    authScopes: { reader: true },
    description: "Entries created, corrected or forgotten, optionally for one scope and scopeRef.",
    args: { scope: t.arg({ type: ScopeEnum }), scopeRef: t.arg.string() },
    subscribe: (_root, args, ctx) =>
      pipe(
        ctx.deps.pubsub.subscribe("entryChanged", ctx.principal.tenantId),
        filter(
          (change) =>
            (!args.scope || change.scope === args.scope) &&
            (!args.scopeRef || change.scopeRef === args.scopeRef),
        ),
      ),
    resolve: (change) => change,
  }),
}));
