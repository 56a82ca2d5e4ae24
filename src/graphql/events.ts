import { filter, pipe } from "graphql-yoga";
import { builder } from "../builder.ts";
import { notFound } from "../errors.ts";
import { appendEvent, eventsWhere } from "../memory/log/events.ts";
import { LIMITS } from "../limits.ts";
import { ScopeEnum } from "./enums.ts";
import { rowOrReread } from "./answer.ts";

builder.prismaObject("MemoryEvent", {
  description: "An immutable raw moment: a call summary, a decision, a campaign change…",
  fields: (t) => ({
    id: t.exposeID("id"),
    scope: t.expose("scope", { type: ScopeEnum }),
    scopeRef: t.exposeString("scopeRef"),
    kind: t.exposeString("kind"),
    body: t.exposeString("body", { description: "Markdown." }),
    source: t.exposeString("source"),
    sourceRef: t.exposeString("sourceRef", { nullable: true }),
    occurredAt: t.expose("occurredAt", { type: "DateTime" }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    compressedAt: t.expose("compressedAt", { type: "DateTime", nullable: true }),
    entry: t.relation("entry", {
      nullable: true,
      description: "The curated entry this event was folded into by the compactor.",
    }),
  }),
});

const AppendEventInput = builder.inputType("AppendEventInput", {
  fields: (t) => ({
    scope: t.field({ type: ScopeEnum, required: true }),
    scopeRef: t.string({ required: true, description: "Entity id, project id or user id, by scope." }),
    kind: t.string({ required: true, description: "Free string: call_summary, decision…" }),
    body: t.string({ required: true, description: "Markdown." }),
    source: t.string({ required: true, description: "Where it came from: a skill, a webhook…" }),
    sourceRef: t.string({
      description: "The source's own id. Appending the same source + sourceRef again is a no-op.",
    }),
    occurredAt: t.field({ type: "DateTime", description: "Defaults to now." }),
  }),
});

builder.queryFields((t) => ({
  event: t.prismaField({
    type: "MemoryEvent",
    authScopes: { reader: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (query, _root, { id }, ctx) => {
      const event = await ctx.db.memoryEvent.findUnique({ ...query, where: { id: String(id) } });
      if (!event) throw notFound("Event", String(id));
      return event;
    },
  }),
  events: t.prismaConnection({
    type: "MemoryEvent",
    cursor: "id",
    authScopes: { reader: true },
    defaultSize: 20,
    maxSize: LIMITS.pageMax,
    description: "Events, newest first. Compressed events are left out unless asked for.",
    args: {
      scope: t.arg({ type: ScopeEnum }),
      scopeRef: t.arg.string(),
      kind: t.arg.string(),
      includeCompressed: t.arg.boolean({ defaultValue: false }),
    },
    resolve: (query, _root, args, ctx) =>
      ctx.db.memoryEvent.findMany({
        ...query,
        where: eventsWhere(args),
        orderBy: [{ occurredAt: "desc" }, { id: "desc" }],
      }),
  }),
}));

builder.mutationFields((t) => ({
  appendEvent: t.prismaField({
    type: "MemoryEvent",
    authScopes: { writer: true },
    description: "Appends an event. Idempotent on (source, sourceRef): a retry returns the first event.",
    args: { input: t.arg({ type: AppendEventInput, required: true }) },
    resolve: async (query, _root, { input }, ctx) => {
      const { event } = await appendEvent(ctx.db, ctx.deps, input);
      return rowOrReread(query, event, () => ctx.db.memoryEvent.findUniqueOrThrow({ ...query, where: { id: event.id } }));
    },
  }),
}));

builder.subscriptionFields((t) => ({
  eventAppended: t.prismaField({
    type: "MemoryEvent",
    authScopes: { reader: true },
    description: "Events as they are appended, optionally for one scope and scopeRef.",
    args: { scope: t.arg({ type: ScopeEnum }), scopeRef: t.arg.string() },
    subscribe: (_root, args, ctx) =>
      pipe(
        ctx.deps.pubsub.subscribe("eventAppended", ctx.principal.tenantId),
        filter(
          (event) =>
            (!args.scope || event.scope === args.scope) &&
            (!args.scopeRef || event.scopeRef === args.scopeRef),
        ),
      ),
    resolve: (query, event, _args, ctx) =>
      ctx.db.memoryEvent.findUniqueOrThrow({ ...query, where: { id: event.id } }),
  }),
}));
