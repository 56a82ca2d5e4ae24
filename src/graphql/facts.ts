import { filter, pipe } from "graphql-yoga";
import { builder, type GraphQLContext } from "../builder.ts";
import { endUserArgs } from "./agents.ts";
import { EngramError, notFound } from "../errors.ts";
import { endUserIdOf } from "../memory/conversations/agents.ts";
import { CONTRADICTION_CHOICES, resolveContradiction, type ContradictionResolution } from "../memory/facts/contradictions.ts";
import { addFact, correctFact, FACT_CAP, listFacts } from "../memory/facts/facts.ts";
import { forgetFact, forgetRecords, forgetUser, type ForgetRecord } from "../memory/forget.ts";
import type { FactChangeKind, FactChangePayload } from "../pubsub.ts";

/** Key records are admins' to list (apiKeys): other keys see only their own, as who wrote or asked. */
const shownKey = (ctx: GraphQLContext, apiKeyId: string | null): boolean =>
  apiKeyId !== null && (ctx.principal.role === "ADMIN" || ctx.principal.apiKeyId === apiKeyId);

const FactOriginEnum = builder.enumType("FactOrigin", {
  description: "Who wrote a fact: the extractor from a user's message, a person, or an API call.",
  values: ["EXTRACTOR", "PERSON", "API"] as const,
});

builder.prismaObject("Fact", {
  description: "One durable statement about one end user.",
  fields: (t) => ({
    id: t.exposeID("id"),
    text: t.exposeString("text", { description: "One self-contained sentence." }),
    core: t.exposeBoolean("core", { description: "Who the user is, or a lasting preference." }),
    subject: t.exposeString("subject", {
      nullable: true,
      description: "Who it is about: null for the end user, else the person they named (\"Ana (daughter)\"). Kept on the end user's profile either way.",
    }),
    sensitivity: t.exposeString("sensitivity", { nullable: true }),
    origin: t.field({ type: FactOriginEnum, resolve: (f) => f.origin as "EXTRACTOR" | "PERSON" | "API" }),
    sourceMessage: t.prismaField({
      type: "Message",
      nullable: true,
      description: "The user's message it was extracted from (null once that message is deleted or forgotten).",
      select: { sourceMessageId: true },
      resolve: (query, fact, _args, ctx) =>
        fact.sourceMessageId ? ctx.db.message.findUnique({ ...query, where: { id: fact.sourceMessageId, forgottenAt: null } }) : null,
    }),
    writtenBy: t.prismaField({
      type: "ApiKey",
      nullable: true,
      description: "The key of the person who wrote or last corrected it: for admins, or the key itself; null for others.",
      select: { apiKeyId: true },
      resolve: (query, fact, _args, ctx) =>
        shownKey(ctx, fact.apiKeyId) ? ctx.db.apiKey.findUnique({ ...query, where: { id: fact.apiKeyId! } }) : null,
    }),
    contradicts: t.prismaField({
      type: "Fact",
      nullable: true,
      description: "The older fact this one contradicts; both are kept, newer first.",
      select: { contradictsId: true },
      resolve: (query, fact, _args, ctx) =>
        fact.contradictsId ? ctx.db.fact.findUnique({ ...query, where: { id: fact.contradictsId } }) : null,
    }),
    confirmedAt: t.expose("confirmedAt", { type: "DateTime", description: "When the user last said it." }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    updatedAt: t.expose("updatedAt", { type: "DateTime" }),
  }),
});

builder.prismaObject("FactVersion", {
  fields: (t) => ({
    id: t.exposeID("id"),
    text: t.exposeString("text"),
    core: t.exposeBoolean("core"),
    change: t.exposeString("change", { description: "ADDED, CONTRADICTED, UPDATED, CORRECTED or RESOLVED (a contradiction settled by a person)." }),
    reason: t.exposeString("reason", { nullable: true }),
    sourceMessage: t.prismaField({
      type: "Message",
      nullable: true,
      description:
        "The user's message this version was extracted from: null for a person's version, for a message since deleted or forgotten, and for versions written before migration 0018 (but each fact's newest).",
      select: { sourceMessageId: true },
      resolve: (query, version, _args, ctx) =>
        version.sourceMessageId ? ctx.db.message.findUnique({ ...query, where: { id: version.sourceMessageId, forgottenAt: null } }) : null,
    }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

export const FactChangeKindEnum = builder.enumType("FactChangeKind", {
  values: ["ADDED", "REFRESHED", "UPDATED", "CONTRADICTED", "CORRECTED", "RESOLVED", "DELETED", "FORGOTTEN"] as const satisfies readonly FactChangeKind[],
});

const FactChange = builder.objectRef<FactChangePayload>("FactChange").implement({
  fields: (t) => ({
    change: t.field({ type: FactChangeKindEnum, resolve: (c) => c.change }),
    endUserId: t.exposeID("endUserId"),
    factId: t.exposeID("factId", { nullable: true }),
    text: t.exposeString("text", { nullable: true, description: "The fact's text (kept for deleted facts)." }),
    reason: t.exposeString("reason"),
    conversationId: t.exposeID("conversationId", { nullable: true }),
    fact: t.prismaField({
      type: "Fact",
      nullable: true,
      description: "The fact as a query would return it now; null once deleted.",
      resolve: (query, c, _args, ctx) => (c.factId ? ctx.db.fact.findUnique({ ...query, where: { id: c.factId } }) : null),
    }),
  }),
});

const ForgetResult = builder.simpleObject("ForgetResult", {
  description: "What forgetting removed, by kind: counts only, never content.",
  fields: (t) => ({
    facts: t.int({ description: "Facts removed." }),
    factVersions: t.int({ description: "Versions in those facts' histories, and versions read from forgotten messages in the histories of facts that stay." }),
    snippets: t.int({ description: "Recall snippets removed, with their vectors." }),
    summaries: t.int({ description: "Conversation summaries cleared." }),
    summaryRevisions: t.int({ description: "Summary revisions deleted." }),
    keptVerdicts: t.int({ description: "Verbatim-judge verdicts cleared." }),
    gateVerdicts: t.int({ description: "Stored gate verdicts deleted." }),
    messages: t.int({ description: "Raw messages deleted (only when the tenant's forgetDeletesMessages is on)." }),
    jobRecords: t.int({ description: "Finished job records of the user's conversations deleted." }),
    events: t.int({ description: "Events about the user as an entity (scope ENTITY, their external id as scopeRef) deleted." }),
    entries: t.int({ description: "Entries about the user as an entity (scope ENTITY, their external id as scopeRef) deleted." }),
    activity: t.int({ description: "Rows of the inspector feed's history deleted (ids and kinds only)." }),
  }),
});

const ForgetRecordRef = builder.objectRef<ForgetRecord>("ForgetRecord").implement({
  description: "One audited forget of a user: who asked, when, what and how many. No content.",
  fields: (t) => ({
    id: t.exposeID("id"),
    at: t.expose("at", { type: "DateTime" }),
    kind: t.exposeString("kind", { description: "USER (everything), PHRASES (what they named), CONVERSATION or FACT." }),
    askedBy: t.prismaField({
      type: "ApiKey",
      nullable: true,
      description: "The key that asked (for admins, or the key itself; null for others); null when the user asked in a message.",
      resolve: (query, record, _args, ctx) =>
        shownKey(ctx, record.apiKeyId) ? ctx.db.apiKey.findUnique({ ...query, where: { id: record.apiKeyId! } }) : null,
    }),
    receipt: t.field({ type: ForgetResult, resolve: (record) => record.receipt }),
  }),
});

const AddFactInput = builder.inputType("AddFactInput", {
  description:
    "The end user by endUserId, or by your own id (endUserExternalId, as recordTurn takes it): exactly one of the two. " +
    "By your id, a user Engram does not know yet is created with the fact, and not at all when the fact is refused.",
  fields: (t) => ({
    endUserId: t.id(),
    endUserExternalId: t.string(),
    text: t.string({ required: true, description: "One self-contained sentence, 3–500 characters." }),
    core: t.boolean(),
    subject: t.string({ description: "Who it is about, when not the end user: a person they named (\"Ana (daughter)\")." }),
  }),
});

const CorrectFactInput = builder.inputType("CorrectFactInput", {
  fields: (t) => ({
    text: t.string(),
    core: t.boolean(),
    subject: t.string({ description: "Absent: unchanged; null or empty: the end user; else the person it is about." }),
  }),
});

const ContradictionChoice = builder.enumType("ContradictionChoice", {
  description: "How a person settles a contradiction pair.",
  values: {
    NEWER: { description: "Keep the newer fact; the older one is deleted." },
    OLDER: { description: "Keep the older fact; the newer one is deleted." },
    BOTH: { description: "Keep both; they no longer contradict each other." },
  } satisfies Record<(typeof CONTRADICTION_CHOICES)[number], object>,
});

const ContradictionResolved = builder.objectRef<ContradictionResolution>("ContradictionResolved").implement({
  fields: (t) => ({
    kept: t.prismaField({
      type: ["Fact"],
      description: "The fact or facts kept, each with a RESOLVED version in its history.",
      resolve: (query, r, _args, ctx) => ctx.db.fact.findMany({ ...query, where: { id: { in: r.kept.map((f) => f.id) } } }),
    }),
    deletedFactId: t.id({ nullable: true, description: "The fact deleted, if one was.", resolve: (r) => r.deleted?.id ?? null }),
  }),
});

const author = (ctx: GraphQLContext) => ({ origin: "PERSON" as const, apiKeyId: ctx.principal.apiKeyId });

builder.queryFields((t) => ({
  forgetRecords: t.field({
    type: [ForgetRecordRef],
    authScopes: { reader: true },
    description: "The user's audited forgets, newest first (at most 100): who, when, what kinds and how many.",
    args: endUserArgs(t.arg),
    resolve: async (_root, args, ctx) => forgetRecords(ctx.db, await endUserIdOf(ctx.db, args)),
  }),
  facts: t.prismaField({
    type: ["Fact"],
    authScopes: { reader: true },
    description: "What the agent knows about a user: core facts first, then the most recently confirmed.",
    args: endUserArgs(t.arg),
    resolve: async (query, _root, args, ctx) => listFacts(ctx.db, await endUserIdOf(ctx.db, args), query),
  }),
  factHistory: t.prismaField({
    type: ["FactVersion"],
    authScopes: { reader: true },
    description: "Every version of a fact, oldest first.",
    args: { factId: t.arg.id({ required: true }) },
    resolve: async (query, _root, { factId }, ctx) => {
      const db = ctx.db;
      if (!(await db.fact.count({ where: { id: String(factId) } }))) throw notFound("Fact", String(factId));
      return db.factVersion.findMany({ ...query, where: { factId: String(factId) }, orderBy: [{ createdAt: "asc" }, { id: "asc" }] });
    },
  }),
}));

builder.mutationFields((t) => ({
  addFact: t.prismaField({
    type: "Fact",
    authScopes: { writer: true },
    description:
      "Adds a fact, written by the calling key. At the cap of 50 facts it drops the least recently confirmed one that is not core; " +
      "when only core facts could make room it writes nothing and answers CONFLICT.",
    args: { input: t.arg({ type: AddFactInput, required: true }) },
    resolve: async (query, _root, { input }, ctx) => {
      const db = ctx.db;
      const fact = await addFact(db, ctx.deps, { ...input, endUserId: input.endUserId == null ? null : String(input.endUserId) }, author(ctx));
      const written = await db.fact.findUnique({ ...query, where: { id: fact.id } });
      // Another fact of the user added at the same moment took the only place a non-core one had.
      if (!written) throw new EngramError("CONFLICT", `The fact was written, then dropped at once to keep the user under the cap of ${FACT_CAP} facts (another was added at the same moment).`);
      return written;
    },
  }),
  correctFact: t.prismaField({
    type: "Fact",
    authScopes: { writer: true },
    args: { id: t.arg.id({ required: true }), input: t.arg({ type: CorrectFactInput, required: true }) },
    resolve: async (query, _root, { id, input }, ctx) => {
      const fact = await correctFact(ctx.db, ctx.deps, String(id), input, { apiKeyId: ctx.principal.apiKeyId });
      // Deleted the moment after it was corrected (a forget, the cap): gone, as a read would say.
      return (await ctx.db.fact.findUnique({ ...query, where: { id: fact.id } })) ?? Promise.reject(notFound("Fact", String(id)));
    },
  }),
  deleteFact: t.field({
    type: FactChange,
    authScopes: { writer: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, { id }, ctx) => {
      const fact = await forgetFact(ctx.db, ctx.deps, String(id), { apiKeyId: ctx.principal.apiKeyId, reason: "deleted by a person" });
      return { change: "DELETED" as const, endUserId: fact.endUserId, factId: fact.id, text: fact.text, reason: "deleted by a person", conversationId: null };
    },
  }),
  resolveContradiction: t.field({
    type: ContradictionResolved,
    authScopes: { writer: true },
    description: "Settles a contradiction pair, named by its newer fact (the one whose `contradicts` is set): keep one and delete the other, or keep both.",
    args: { factId: t.arg.id({ required: true }), keep: t.arg({ type: ContradictionChoice, required: true }) },
    resolve: (_root, { factId, keep }, ctx) =>
      resolveContradiction(ctx.db, ctx.deps, { factId: String(factId), keep }, { apiKeyId: ctx.principal.apiKeyId }),
  }),
  forgetUser: t.field({
    type: ForgetResult,
    authScopes: { writer: true },
    description:
      "Forget everything about a user, from every copy: facts and their history, recall snippets and vectors, " +
      "summaries and their revisions, stored verdicts, job records and (when the tenant's forgetDeletesMessages " +
      "is on, the default) their messages. Answers a receipt of kinds and counts; the receipt is also audited.",
    args: endUserArgs(t.arg),
    resolve: async (_root, args, ctx) =>
      forgetUser(ctx.db, ctx.deps, await endUserIdOf(ctx.db, args), { apiKeyId: ctx.principal.apiKeyId, reason: "forget everything" }),
  }),
}));

builder.subscriptionFields((t) => ({
  factChanged: t.field({
    type: FactChange,
    authScopes: { reader: true },
    description: "Facts added, refreshed, updated, contradicted, corrected, deleted or forgotten, with the reason.",
    args: endUserArgs(t.arg),
    // An unknown user is NOT_FOUND, as for the facts query: not a subscription silent for ever.
    subscribe: async (_root, args, ctx) => {
      const endUserId = await endUserIdOf(ctx.db, args);
      return pipe(
        ctx.deps.pubsub.subscribe("factChanged", ctx.principal.tenantId),
        filter((change) => change.endUserId === endUserId),
      );
    },
    resolve: (change) => change,
  }),
}));
