import { builder } from "../builder.ts";
import { MEMORY_KINDS, searchMemory, type MemoryHit } from "../memory/search.ts";

const MemoryKindEnum = builder.enumType("MemoryKind", {
  description: "The shapes of memory a search looks through.",
  values: MEMORY_KINDS,
});

const MemoryHitRef = builder.objectRef<MemoryHit>("MemoryHit").implement({
  description: "One match of a memory search, with where it lives (ids to link to, and names to show).",
  fields: (t) => ({
    kind: t.field({ type: MemoryKindEnum, resolve: (hit) => hit.kind }),
    id: t.exposeID("id", { description: "The fact's, entry's, event's or recall snippet's id." }),
    rank: t.exposeFloat("rank", { description: "Text relevance; higher is better." }),
    at: t.expose("at", {
      type: "DateTime",
      description: "When the user last said it (facts), it happened (events, snippets), or was last updated (entries).",
    }),
    title: t.exposeString("title", { nullable: true, description: "An entry's title, an event's kind." }),
    text: t.exposeString("text"),
    endUserId: t.exposeID("endUserId", { nullable: true }),
    endUserName: t.exposeString("endUserName", { nullable: true }),
    conversationId: t.exposeID("conversationId", { nullable: true, description: "Where it was said (facts from a message, snippets)." }),
    conversationName: t.exposeString("conversationName", { nullable: true, description: "That conversation's own id." }),
    messageId: t.exposeID("messageId", { nullable: true }),
    messageSeq: t.exposeInt("messageSeq", { nullable: true, description: "The message's number in its conversation." }),
    scope: t.exposeString("scope", { nullable: true, description: "Entries and events." }),
    scopeRef: t.exposeString("scopeRef", { nullable: true }),
  }),
});

builder.queryFields((t) => ({
  searchMemory: t.field({
    type: [MemoryHitRef],
    authScopes: { reader: true },
    description:
      "Facts, entries, events and recall snippets matching a text, across every user of the tenant, best first. " +
      "By user: their facts and snippets, and entries and events about them as an entity (scope ENTITY under their own id). By agent: facts of " +
      "the users it talks with and snippets of its conversations (entries and events have no agent and are left out).",
    args: {
      text: t.arg.string({ required: true, description: "2–200 characters. Every English word must match (stemmed); a text with no words (stop words, punctuation) is matched as typed." }),
      endUserId: t.arg.id(),
      agentId: t.arg.id(),
      kinds: t.arg({ type: [MemoryKindEnum] }),
      since: t.arg({ type: "DateTime" }),
      until: t.arg({ type: "DateTime" }),
      first: t.arg.int({ defaultValue: 30, description: "At most 100." }),
    },
    resolve: (_root, args, ctx) =>
      searchMemory(ctx.db, {
        text: args.text,
        endUserId: args.endUserId ? String(args.endUserId) : null,
        agentId: args.agentId ? String(args.agentId) : null,
        kinds: args.kinds,
        since: args.since,
        until: args.until,
        first: args.first,
      }),
  }),
}));
