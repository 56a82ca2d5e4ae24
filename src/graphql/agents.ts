import type { ArgBuilder } from "@pothos/core";
import { queryFromInfo } from "@pothos/plugin-prisma";
import { builder } from "../builder.ts";
import { notFound, parseInput } from "../errors.ts";
import { agentSettings, endUserIdOf, externalIdSchema, upsertAgent, upsertEndUser } from "../memory/conversations/agents.ts";
import { LIMITS } from "../limits.ts";
import { EXPORT_PATH, exportUser } from "../memory/export.ts";
import { recentFirst } from "./recent-first.ts";

/**
 * The two ways a field names the end user it is about, as recordTurn names them: Engram's id or
 * the caller's own. Exactly one is given; `endUserIdOf` resolves them.
 */
export const endUserArgs = (arg: ArgBuilder<typeof builder.$inferSchemaTypes>) => ({
  endUserId: arg.id({ description: "Engram's id of the end user." }),
  endUserExternalId: arg.string({ description: "Your own id of the end user, as recordTurn takes it." }),
});

const AgentSettings = builder.objectRef<ReturnType<typeof agentSettings>>("AgentSettings").implement({
  description: "An agent's memory settings, defaults filled in.",
  fields: (t) => ({
    summaryOn: t.exposeBoolean("summaryOn", { description: "Fold older messages into a running summary (default true)." }),
    tailSize: t.exposeInt("tailSize", { description: "Messages sent word for word (default 6)." }),
    historySize: t.exposeInt("historySize", { description: "Window when the summary is off, and the baseline (default 20)." }),
    summaryWordLimit: t.exposeInt("summaryWordLimit", { description: "Default 150." }),
    recallOn: t.exposeBoolean("recallOn", { description: "Recall earlier conversations (default true)." }),
    extractionOn: t.exposeBoolean("extractionOn", { description: "Extract user facts (default true)." }),
    allowSensitiveFacts: t.exposeBoolean("allowSensitiveFacts", { description: "Keep health, finance, identity… facts (default false)." }),
    extractionBatchSize: t.exposeInt("extractionBatchSize", { description: "Shared messages per extraction batch (default 8)." }),
    quietExtractionSeconds: t.exposeInt("quietExtractionSeconds", {
      description: "After this long without a new message, the extractor reads what is pending even below a batch (default 600; 0 off).",
    }),
  }),
});

const AgentSettingsInput = builder.inputType("AgentSettingsInput", {
  description: "Only the settings given change.",
  fields: (t) => ({
    summaryOn: t.boolean(),
    tailSize: t.int(),
    historySize: t.int(),
    summaryWordLimit: t.int(),
    recallOn: t.boolean(),
    extractionOn: t.boolean(),
    allowSensitiveFacts: t.boolean(),
    extractionBatchSize: t.int(),
    quietExtractionSeconds: t.int(),
  }),
});

builder.prismaObject("Agent", {
  fields: (t) => ({
    id: t.exposeID("id"),
    externalId: t.exposeString("externalId", { description: "The caller's own id for the agent." }),
    name: t.exposeString("name"),
    settings: t.field({ type: AgentSettings, select: { settings: true }, resolve: (agent) => agentSettings(agent) }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

const EndUser = builder.prismaObject("EndUser", {
  description: "A person an agent talks to.",
  fields: (t) => ({
    id: t.exposeID("id"),
    externalId: t.exposeString("externalId", { description: "The caller's own id for the user." }),
    displayName: t.exposeString("displayName", { nullable: true }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    conversations: t.relatedConnection("conversations", {
      cursor: "id",
      maxSize: LIMITS.pageMax,
      query: { orderBy: [{ updatedAt: "desc" }, { id: "desc" }] },
    }),
  }),
});

const UpsertAgentInput = builder.inputType("UpsertAgentInput", {
  fields: (t) => ({
    externalId: t.string({ required: true }),
    name: t.string(),
    settings: t.field({ type: AgentSettingsInput }),
  }),
});

const UpsertEndUserInput = builder.inputType("UpsertEndUserInput", {
  fields: (t) => ({ externalId: t.string({ required: true }), displayName: t.string() }),
});

builder.queryFields((t) => ({
  agent: t.prismaField({
    type: "Agent",
    authScopes: { reader: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (query, _root, { id }, ctx) => {
      const agent = await ctx.db.agent.findUnique({ ...query, where: { id: String(id) } });
      if (!agent) throw notFound("Agent", String(id));
      return agent;
    },
  }),
  agents: t.prismaField({
    type: ["Agent"],
    authScopes: { reader: true },
    resolve: (query, _root, _args, ctx) => ctx.db.agent.findMany({ ...query, orderBy: { name: "asc" }, take: 500 }),
  }),
  endUser: t.prismaField({
    type: "EndUser",
    authScopes: { reader: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (query, _root, { id }, ctx) => {
      const user = await ctx.db.endUser.findUnique({ ...query, where: { id: String(id) } });
      if (!user) throw notFound("End user", String(id));
      return user;
    },
  }),
  endUserByExternalId: t.prismaField({
    type: "EndUser",
    nullable: true,
    authScopes: { reader: true },
    description: "The end user known by your own id, or null before Engram has seen them.",
    args: { externalId: t.arg.string({ required: true }) },
    // Trimmed and bounded as recordTurn takes it, so " bob" is the bob it recorded.
    resolve: (query, _root, { externalId }, ctx) =>
      ctx.db.endUser.findFirst({ ...query, where: { externalId: parseInput(externalIdSchema, externalId) } }),
  }),
  exportUser: t.field({
    type: "JSON",
    authScopes: { admin: true },
    description:
      "Everything Engram holds about one person (facts with history, conversations with summaries and revisions, " +
      "recall snippets' text, entries of their scope) as JSON: the right-of-access twin of forgetUser. Up to " +
      `${LIMITS.exportRowsMax} rows (conversations, messages, summary revisions, snippets, fact versions, entries, events); above that EXPORT_TOO_LARGE, and ` +
      `GET ${EXPORT_PATH}/<endUserId> (admin key) streams the same document at any size.`,
    args: endUserArgs(t.arg),
    resolve: async (_root, args, ctx) => exportUser(ctx.db, await endUserIdOf(ctx.db, args), { apiKeyId: ctx.principal.apiKeyId, via: "graphql" }),
  }),
  endUsers: t.connection({
    type: EndUser,
    authScopes: { reader: true },
    description: "Most recently added or updated first.",
    resolve: (_root, args, ctx, info) => {
      const query = queryFromInfo({ context: ctx, info, path: ["edges", "node"] });
      return recentFirst(args, (page) => ctx.db.endUser.findMany({ ...query, ...page }));
    },
  }),
}));

builder.mutationFields((t) => ({
  upsertAgent: t.prismaField({
    type: "Agent",
    // Agents and their memory settings (sensitive facts, extraction, recall) are the tenant's
    // policy: admins only, audited. Writers' turns create an agent at its defaults on first use.
    authScopes: { admin: true },
    description: "Creates or updates an agent by your own id; settings given are merged over stored ones. Admins only; audited (agent.upsert).",
    args: { input: t.arg({ type: UpsertAgentInput, required: true }) },
    resolve: async (query, _root, { input }, ctx) => {
      const db = ctx.db;
      const agent = await upsertAgent(db, input, { apiKeyId: ctx.principal.apiKeyId });
      return db.agent.findUniqueOrThrow({ ...query, where: { id: agent.id } });
    },
  }),
  upsertEndUser: t.prismaField({
    type: "EndUser",
    authScopes: { writer: true },
    args: { input: t.arg({ type: UpsertEndUserInput, required: true }) },
    resolve: async (query, _root, { input }, ctx) => {
      const db = ctx.db;
      const user = await upsertEndUser(db, input);
      return db.endUser.findUniqueOrThrow({ ...query, where: { id: user.id } });
    },
  }),
}));
