import { filter, pipe } from "graphql-yoga";
import { builder } from "../builder.ts";
import { endUserArgs } from "./agents.ts";
import { badInput } from "../errors.ts";
import { MESSAGE_LIMITS } from "../limits.ts";
import { endUserIdOf, requireEndUser } from "../memory/conversations/agents.ts";
import { searchSnippets, type RecallCandidate, type RecallEvent } from "../memory/recall/recall.ts";
import { recallIndexStatus, type RecallIndexStatus } from "../memory/recall/snippets.ts";

const SnippetKindEnum = builder.enumType("SnippetKind", {
  description: "TURN: a user message with its replies; SUMMARY: a sentence of a conversation's accepted summary (a key: a hit on it is credited to the covered turn it points to, and it is returned itself only when it points to none); FACT: a fact's sentence (a key: a hit on it is credited to its turn, never returned itself).",
  values: ["TURN", "SUMMARY", "FACT"] as const,
});

const RecallModeEnum = builder.enumType("RecallMode", {
  description: "Which retrievers the recall query uses: both fused (the default), or one alone.",
  values: ["HYBRID", "VECTOR", "KEYWORD"] as const,
});

const RecallCandidateRef = builder.objectRef<RecallCandidate>("RecallCandidate").implement({
  description: "A snippet of an earlier conversation found for a message, with how it was found.",
  fields: (t) => ({
    snippetId: t.exposeID("snippetId"),
    kind: t.field({ type: SnippetKindEnum, resolve: (c) => c.kind }),
    text: t.exposeString("text"),
    conversationId: t.exposeID("conversationId", { description: "The conversation the snippet comes from." }),
    messageIds: t.exposeIDList("messageIds", { description: "The messages it holds (none for a summary)." }),
    messageSeqs: t.exposeIntList("messageSeqs", { description: "Their sequence numbers, in the same order." }),
    occurredAt: t.expose("occurredAt", { type: "DateTime" }),
    indexedAt: t.expose("indexedAt", {
      type: "DateTime",
      nullable: true,
      description: "When its vector was stored; null while it waits (then only keyword search finds it).",
    }),
    vectorScore: t.exposeFloat("vectorScore", { nullable: true, description: "Cosine similarity; null if not a vector hit." }),
    vectorRank: t.exposeInt("vectorRank", { nullable: true }),
    keywordScore: t.exposeFloat("keywordScore", { nullable: true, description: "Full-text rank; null if no keyword hit." }),
    keywordRank: t.exposeInt("keywordRank", { nullable: true }),
    fusedScore: t.exposeFloat("fusedScore", { description: "Reciprocal rank fusion of both ranks, plus the time boost." }),
    timeMatch: t.exposeBoolean("timeMatch", {
      description: "In the time the text names (\"in May\", \"last Tuesday\", \"the last time\"), which ranks it higher.",
    }),
    judgeScore: t.exposeInt("judgeScore", { nullable: true, description: "The re-rank judge's 0–3, when it ran." }),
    chosen: t.exposeBoolean("chosen", { description: "Injected into the context." }),
  }),
});

export const RecallEventRef = builder.objectRef<RecallEvent>("RecallEvent").implement({
  description: "One recall on a turn: the message, every candidate with its scores, and what was chosen.",
  fields: (t) => ({
    id: t.exposeID("id"),
    endUserId: t.exposeID("endUserId"),
    conversationId: t.exposeID("conversationId", { nullable: true }),
    message: t.exposeString("message"),
    at: t.expose("at", { type: "DateTime" }),
    candidates: t.field({ type: [RecallCandidateRef], resolve: (e) => e.candidates }),
    chosen: t.field({ type: [RecallCandidateRef], resolve: (e) => e.candidates.filter((c) => c.chosen) }),
    chosenBy: t.exposeString("chosenBy", { description: "JUDGE (the re-ranker) or FLOOR (no model: similarity floor)." }),
    degraded: t.exposeString("degraded", { nullable: true, description: "Why vector search was skipped, if it was." }),
  }),
});

const RecallResultRef = builder.simpleObject("RecallResult", {
  fields: (t) => ({
    candidates: t.field({ type: [RecallCandidateRef] }),
    degraded: t.string({ nullable: true, description: "Why vector search was skipped, if it was." }),
  }),
});

const RecallInput = builder.inputType("RecallInput", {
  description: "The end user by endUserId, or by your own id (endUserExternalId, as recordTurn takes it): exactly one of the two.",
  fields: (t) => ({
    endUserId: t.id(),
    endUserExternalId: t.string(),
    text: t.string({ required: true }),
    excludeConversationId: t.id({ description: "Leave this conversation out, as recall on a turn does." }),
    k: t.int({ defaultValue: 10, description: "How many candidates, 1–50." }),
    mode: t.field({ type: RecallModeEnum, defaultValue: "HYBRID" }),
    at: t.field({
      type: "DateTime",
      description: "When the text was said, to resolve \"last Tuesday\" or \"two months ago\" (default now).",
    }),
  }),
});

const RecallIndexStatusRef = builder.objectRef<RecallIndexStatus>("RecallIndexStatus").implement({
  description: "How much of an end user's conversations is not searchable yet.",
  fields: (t) => ({
    pending: t.exposeInt("pending", {
      description:
        "Turns still in the outbox (their snippets not written yet) plus snippets without a vector (not embedded " +
        "yet). A turn left without a snippet on purpose (private steps, forgotten messages, a deleted fact's turn) or " +
        "whose snippet a forget or the retention window took is not pending. 0: everything recall will search is searchable.",
    }),
    oldestPendingAt: t.expose("oldestPendingAt", {
      type: "DateTime",
      nullable: true,
      description: "When the oldest of them was recorded; null when nothing is pending.",
    }),
  }),
});

builder.queryFields((t) => ({
  recallIndexStatus: t.field({
    type: RecallIndexStatusRef,
    authScopes: { reader: true },
    description: "Whether recall has caught up with what was recorded for an end user: wait for pending 0 instead of searching.",
    args: endUserArgs(t.arg),
    resolve: async (_root, args, ctx) => recallIndexStatus(ctx.db, await endUserIdOf(ctx.db, args)),
  }),
  recall: t.field({
    type: RecallResultRef,
    authScopes: { reader: true },
    description:
      "The ranked recall candidates for a text from one end user's conversations, with vector, keyword " +
      "and fused scores. For debugging and evals: it skips the gate and the re-rank judge.",
    args: { input: t.arg({ type: RecallInput, required: true }) },
    resolve: async (_root, { input }, ctx) => {
      const endUserId = await endUserIdOf(ctx.db, input, { checkId: false });
      const k = input.k ?? 10;
      if (k < 1 || k > 50) throw badInput("k must be between 1 and 50.");
      // As long as a message may be: a longer text would hold the encoder (and with it the server) for seconds.
      if (input.text.length > MESSAGE_LIMITS.messageMaxChars) {
        throw badInput(`text is at most ${MESSAGE_LIMITS.messageMaxChars} characters, as a message is; this one has ${input.text.length}.`);
      }
      const found = await searchSnippets(ctx.db, ctx.deps, {
        endUserId,
        text: input.text,
        excludeConversationId: input.excludeConversationId ? String(input.excludeConversationId) : null,
        k,
        mode: input.mode ?? "HYBRID",
        at: input.at ?? undefined,
      });
      // Snippets found are the user's, so the user exists: only an empty answer asks (a statement
      // less on the path an agent waits on; an unknown id costs its one query embedding).
      if (found.candidates.length === 0) await requireEndUser(ctx.db, endUserId);
      return found;
    },
  }),
}));

builder.subscriptionFields((t) => ({
  memoryRecall: t.field({
    type: RecallEventRef,
    authScopes: { reader: true },
    description: "Each recall for the end user as it happens (the inspector's memory.recall entry).",
    args: endUserArgs(t.arg),
    // An unknown user is NOT_FOUND: not a subscription silent for ever.
    subscribe: async (_root, args, ctx) => {
      const endUserId = await endUserIdOf(ctx.db, args);
      return pipe(
        ctx.deps.pubsub.subscribe("memoryRecall", ctx.principal.tenantId),
        filter((event) => event.endUserId === endUserId),
      );
    },
    resolve: (event) => event,
  }),
}));
