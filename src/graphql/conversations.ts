import { filter, pipe } from "graphql-yoga";
import { queryFromInfo } from "@pothos/plugin-prisma";
import { builder } from "../builder.ts";
import { notFound, parseInput } from "../errors.ts";
import { externalIdSchema } from "../memory/conversations/agents.ts";
import { LIMITS } from "../limits.ts";
import { importConversation, recordTurn } from "../memory/conversations/turns.ts";
import { forgetConversation } from "../memory/forget.ts";
import { afterTurnRecorded } from "../work/after-turn.ts";
import { rowOrReread } from "./answer.ts";
import { recentFirst } from "./recent-first.ts";

const MessageRoleEnum = builder.enumType("MessageRole", {
  values: ["USER", "ASSISTANT", "SYSTEM", "TOOL"] as const,
});

// A tenant that keeps forgotten messages (forgetDeletesMessages off) keeps them as a record for
// exportUser, not as memory: an agent reading its conversation back must not get them.
const FORGOTTEN_LEFT_OUT = "Messages forgotten but kept as a record (forgetDeletesMessages off) are left out; exportUser lists them.";

builder.prismaObject("Message", {
  fields: (t) => ({
    id: t.exposeID("id"),
    conversationId: t.exposeID("conversationId"),
    seq: t.exposeInt("seq", { description: "Gapless from 1 within the conversation." }),
    role: t.expose("role", { type: MessageRoleEnum }),
    content: t.exposeString("content"),
    private: t.exposeBoolean("private", { description: "An agent's private step: never shared memory." }),
    keepScore: t.exposeInt("keepScore", {
      nullable: true,
      description: "The verbatim judge's score: 0 noise, 1 background, 2 useful, 3 essential.",
    }),
    occurredAt: t.expose("occurredAt", { type: "DateTime" }),
  }),
});

builder.prismaObject("SummaryRevision", {
  description: "One rewrite of a conversation's summary, accepted or rejected by the loss judge.",
  fields: (t) => ({
    id: t.exposeID("id"),
    conversationId: t.exposeID("conversationId"),
    text: t.exposeString("text"),
    words: t.exposeInt("words"),
    coveredThroughSeq: t.exposeInt("coveredThroughSeq"),
    accepted: t.exposeBoolean("accepted"),
    reason: t.exposeString("reason", { nullable: true, description: "The loss judge's reason." }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

const Conversation = builder.prismaObject("Conversation", {
  fields: (t) => ({
    id: t.exposeID("id"),
    externalId: t.exposeString("externalId"),
    agent: t.relation("agent"),
    endUser: t.relation("endUser"),
    summary: t.exposeString("summary", { nullable: true, description: "The accepted running summary." }),
    summaryThroughSeq: t.exposeInt("summaryThroughSeq", { description: "The last message the summary covers." }),
    lastSeq: t.exposeInt("lastSeq"),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    updatedAt: t.expose("updatedAt", { type: "DateTime" }),
    messages: t.relatedConnection("messages", {
      cursor: "id",
      maxSize: 500,
      description: FORGOTTEN_LEFT_OUT,
      args: {
        includePrivate: t.arg.boolean({ defaultValue: false }),
        throughSeq: t.arg.int({
          description: "Only messages up to this seq: with `last`, a window of the history that ends there (a message's neighbours in a long conversation).",
        }),
      },
      query: (args) => ({
        where: {
          forgottenAt: null,
          ...(args.includePrivate ? {} : { private: false }),
          ...(args.throughSeq != null ? { seq: { lte: args.throughSeq } } : {}),
        },
        orderBy: { seq: "asc" },
      }),
    }),
    revisions: t.relation("revisions", {
      query: { orderBy: [{ createdAt: "desc" }, { id: "desc" }] },
    }),
  }),
});

builder.prismaObject("Turn", {
  fields: (t) => ({
    id: t.exposeID("id"),
    clientTurnId: t.exposeString("clientTurnId"),
    occurredAt: t.expose("occurredAt", { type: "DateTime" }),
    firstSeq: t.exposeInt("firstSeq"),
    lastSeq: t.exposeInt("lastSeq"),
    conversation: t.relation("conversation"),
    messages: t.prismaField({
      type: ["Message"],
      description: FORGOTTEN_LEFT_OUT,
      args: { includePrivate: t.arg.boolean({ defaultValue: false }) },
      select: { conversationId: true, firstSeq: true, lastSeq: true },
      resolve: (query, turn, args, ctx) =>
        ctx.db.message.findMany({
          ...query,
          where: {
            conversationId: turn.conversationId,
            seq: { gte: turn.firstSeq, lte: turn.lastSeq },
            forgottenAt: null,
            ...(args.includePrivate ? {} : { private: false }),
          },
          orderBy: { seq: "asc" },
        }),
    }),
  }),
});

const RecordTurnInput = builder.inputType("RecordTurnInput", {
  fields: (t) => ({
    agentExternalId: t.string({ required: true }),
    endUserExternalId: t.string({ required: true }),
    conversationExternalId: t.string({ required: true, description: "The conversation is created on first use." }),
    clientTurnId: t.string({ required: true, description: "Your id for this turn: a retry with it and the same messages records nothing new; with other messages it is CONFLICT." }),
    userMessage: t.string({ required: true }),
    assistantMessage: t.string(),
    privateSteps: t.stringList({ description: "The agent's private steps: kept, never shared memory." }),
    occurredAt: t.field({ type: "DateTime", description: "For backfills; defaults to now." }),
    gate: t.field({
      type: "JSON",
      description:
        "Your model's verdict on userMessage (see gateInstructions): stored as the turn's gate verdict, so the " +
        "turn's background work makes no gate call. Checked against the verdict's schema (BAD_USER_INPUT otherwise).",
    }),
  }),
});

const ImportMessageInput = builder.inputType("ImportMessageInput", {
  fields: (t) => ({
    role: t.field({ type: MessageRoleEnum, required: true }),
    content: t.string({ required: true }),
    occurredAt: t.field({ type: "DateTime" }),
    private: t.boolean(),
  }),
});

const ImportConversationInput = builder.inputType("ImportConversationInput", {
  fields: (t) => ({
    agentExternalId: t.string({ required: true }),
    endUserExternalId: t.string({ required: true }),
    conversationExternalId: t.string({ required: true }),
    messages: t.field({ type: [ImportMessageInput], required: true }),
  }),
});

builder.queryFields((t) => ({
  conversation: t.prismaField({
    type: "Conversation",
    authScopes: { reader: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (query, _root, { id }, ctx) => {
      const conversation = await ctx.db.conversation.findUnique({ ...query, where: { id: String(id) } });
      if (!conversation) throw notFound("Conversation", String(id));
      return conversation;
    },
  }),
  conversationByExternalId: t.prismaField({
    type: "Conversation",
    nullable: true,
    authScopes: { reader: true },
    description: "The conversation recorded under your own id, or null before its first turn (clients that know only their own ids start here).",
    args: { externalId: t.arg.string({ required: true }) },
    // Trimmed and bounded as recordTurn takes it, so " c1" is the c1 it recorded.
    resolve: (query, _root, { externalId }, ctx) =>
      ctx.db.conversation.findFirst({ ...query, where: { externalId: parseInput(externalIdSchema, externalId) } }),
  }),
  conversations: t.connection({
    type: Conversation,
    authScopes: { reader: true },
    description: "Most recently active first.",
    args: { agentId: t.arg.id(), endUserId: t.arg.id() },
    resolve: (_root, args, ctx, info) => {
      const query = queryFromInfo({ context: ctx, info, path: ["edges", "node"] });
      return recentFirst(args, (page) =>
        ctx.db.conversation.findMany({
          ...query,
          ...page,
          where: {
            ...(args.agentId ? { agentId: String(args.agentId) } : {}),
            ...(args.endUserId ? { endUserId: String(args.endUserId) } : {}),
            ...page.where,
          },
        }),
      );
    },
  }),
  summaryRevisions: t.prismaField({
    type: ["SummaryRevision"],
    authScopes: { reader: true },
    description: "Every rewrite of the conversation's summary, newest first.",
    args: { conversationId: t.arg.id({ required: true }) },
    resolve: async (query, _root, { conversationId }, ctx) => {
      const db = ctx.db;
      if (!(await db.conversation.count({ where: { id: String(conversationId) } }))) {
        throw notFound("Conversation", String(conversationId));
      }
      return db.summaryRevision.findMany({
        ...query,
        where: { conversationId: String(conversationId) },
        orderBy: [{ createdAt: "desc" }, { id: "desc" }],
      });
    },
  }),
}));

builder.mutationFields((t) => ({
  recordTurn: t.prismaField({
    type: "Turn",
    authScopes: { writer: true },
    description:
      "Records a turn: the user's message, the agent's private steps and its reply. Creates the " +
      "agent, user and conversation on first use. Idempotent on clientTurnId.",
    args: { input: t.arg({ type: RecordTurnInput, required: true }) },
    resolve: async (query, _root, { input }, ctx) => {
      const recorded = await recordTurn(ctx.db, input, { rows: "include" in query });
      await afterTurnRecorded(ctx.db, ctx.deps, recorded);
      const known = recorded.rows && {
        conversation: { row: recorded.rows.conversation, relations: { agent: { row: recorded.rows.agent }, endUser: { row: recorded.rows.endUser } } },
      };
      return rowOrReread(query, recorded.turn, () => ctx.db.turn.findUniqueOrThrow({ ...query, where: { id: recorded.turn.id } }), known);
    },
  }),
  importConversation: t.prismaField({
    type: "Conversation",
    authScopes: { writer: true },
    description:
      "Backfills a whole past conversation into a new one, for moving from another memory system. The same import again returns the first; other messages into a conversation that has some are CONFLICT.",
    args: { input: t.arg({ type: ImportConversationInput, required: true }) },
    resolve: async (query, _root, { input }, ctx) => {
      const imported = await importConversation(ctx.db, input);
      await afterTurnRecorded(ctx.db, ctx.deps, imported);
      return ctx.db.conversation.findUniqueOrThrow({ ...query, where: { id: imported.conversation.id } });
    },
  }),
}));

const DeletedConversation = builder.simpleObject("DeletedConversation", {
  fields: (t) => ({
    id: t.id(),
    messages: t.int({ description: "Messages deleted." }),
    snippets: t.int({ description: "Recall snippets deleted, with their vectors." }),
    facts: t.int({ description: "Facts extracted from its messages, deleted with their history and recall keys." }),
  }),
});

builder.mutationFields((t) => ({
  deleteConversation: t.field({
    type: DeletedConversation,
    authScopes: { writer: true },
    description: "Deletes a conversation, its messages, summary revisions, recall data (vectors included) and the facts extracted from its messages.",
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, { id }, ctx) => {
      const { conversation, receipt } = await forgetConversation(ctx.db, ctx.deps, String(id), {
        apiKeyId: ctx.principal.apiKeyId,
        reason: "the conversation was deleted",
      });
      return { id: conversation.id, messages: receipt.messages, snippets: receipt.snippets, facts: receipt.facts };
    },
  }),
}));

builder.subscriptionFields((t) => ({
  summaryChanged: t.prismaField({
    type: "SummaryRevision",
    authScopes: { reader: true },
    description: "Each summary rewrite of the conversation as it happens, accepted or rejected with the reason.",
    args: { conversationId: t.arg.id({ required: true }) },
    subscribe: (_root, args, ctx) =>
      pipe(
        ctx.deps.pubsub.subscribe("summaryChanged", ctx.principal.tenantId),
        filter((change) => change.conversationId === String(args.conversationId)),
      ),
    resolve: (query, change, _args, ctx) =>
      ctx.db.summaryRevision.findUniqueOrThrow({ ...query, where: { id: change.revisionId } }),
  }),
  turnRecorded: t.prismaField({
    type: "Turn",
    authScopes: { reader: true },
    description: "Turns recorded for the agent, as they are recorded.",
    args: { agentId: t.arg.id({ required: true }) },
    subscribe: (_root, args, ctx) =>
      pipe(
        ctx.deps.pubsub.subscribe("turnRecorded", ctx.principal.tenantId),
        filter((turn) => turn.agentId === String(args.agentId)),
      ),
    resolve: (query, turn, _args, ctx) =>
      ctx.db.turn.findUniqueOrThrow({ ...query, where: { id: turn.turnId } }),
  }),
}));
