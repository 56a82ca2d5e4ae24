import { builder } from "../builder.ts";
import { contextForTurn } from "../work/context-for-turn.ts";
import type { AssembledContext, ContextBlock, ContextItem } from "../memory/context.ts";

const BlockKindEnum = builder.enumType("ContextBlockKind", {
  values: ["FACTS", "ENTRIES", "RECALL", "SUMMARY", "KEPT", "TAIL"] as const,
});

const ContextItemRef = builder.objectRef<ContextItem>("ContextItem").implement({
  description: "One thing in a block: a message, an entry, a fact or a snippet.",
  fields: (t) => ({
    id: t.exposeID("id"),
    text: t.exposeString("text"),
    tokens: t.exposeInt("tokens"),
    seq: t.exposeInt("seq", { nullable: true }),
    role: t.exposeString("role", { nullable: true }),
    score: t.exposeInt("score", { nullable: true, description: "Keep score, importance or relevance, by block." }),
  }),
});

const ContextBlockRef = builder.objectRef<ContextBlock>("ContextBlock").implement({
  fields: (t) => ({
    kind: t.field({ type: BlockKindEnum, resolve: (b) => b.kind }),
    title: t.exposeString("title"),
    text: t.exposeString("text", { description: "Ready to put in the prompt." }),
    tokens: t.exposeInt("tokens", { description: "o200k_base tokens of text." }),
    items: t.field({ type: [ContextItemRef], resolve: (b) => b.items }),
  }),
});

const ContextRef = builder.objectRef<AssembledContext>("Context").implement({
  description: "Prompt material for an agent's next model call, with what it costs and saves.",
  fields: (t) => ({
    conversationId: t.exposeID("conversationId", {
      nullable: true,
      description: "Null when the conversation, asked for by external ids, has no turn yet.",
    }),
    blocks: t.field({ type: [ContextBlockRef], resolve: (c) => c.blocks }),
    totalTokens: t.exposeInt("totalTokens"),
    baselineTokens: t.exposeInt("baselineTokens", {
      description: "Tokens of sending the last history-size messages whole instead.",
    }),
    savedTokens: t.exposeInt("savedTokens", { description: "baselineTokens − totalTokens." }),
    degraded: t.exposeStringList("degraded", {
      description:
        "Why recall gave less than it would have (keyword matches only, or no recall), in the words of recall's " +
        "degraded; empty when nothing degraded.",
    }),
  }),
});

const ContextInput = builder.inputType("ContextInput", {
  description:
    "The conversation by conversationId, or by your own ids (all three, as recordTurn takes them): exactly one of the two. " +
    "By external ids, a conversation with no turn yet gets what Engram knows of the user beyond it (facts, recall, " +
    "notes), or an empty context when the user is new too.",
  fields: (t) => ({
    conversationId: t.id(),
    agentExternalId: t.string(),
    endUserExternalId: t.string(),
    conversationExternalId: t.string(),
    message: t.string({ required: true, description: "The user's new message the agent is about to answer." }),
    gate: t.field({
      type: "JSON",
      description:
        "Your model's verdict on the message (see gateInstructions). Decides recall, and (from a writer or admin key) " +
        "is stored for the turn's background work, which then makes no gate call; a reader key's verdict decides " +
        "recall only. Without it, recall is decided locally (no model call).",
    }),
  }),
});

builder.queryFields((t) => ({
  context: t.field({
    type: ContextRef,
    authScopes: { reader: true },
    args: { input: t.arg({ type: ContextInput, required: true }) },
    resolve: (_root, { input }, ctx) =>
      contextForTurn(
        ctx.db,
        ctx.deps,
        { ...input, conversationId: input.conversationId == null ? null : String(input.conversationId) },
        { storeVerdict: ctx.principal.role !== "READER" },
      ),
  }),
}));
