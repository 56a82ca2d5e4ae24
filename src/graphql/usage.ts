import { builder } from "../builder.ts";
import { loadTenantSettings } from "../governance/settings.ts";
import { modelUsageReport, USAGE_GROUPS } from "../governance/usage.ts";

const UsageGroupEnum = builder.enumType("ModelUsageGroup", {
  description: "What usage rows are grouped by. TENANT is always the caller's own tenant.",
  values: USAGE_GROUPS,
});

const UsageRow = builder.simpleObject("ModelUsageRow", {
  description: "One group of model usage; fields not grouped by are null.",
  fields: (t) => ({
    purpose: t.string({ nullable: true, description: "memory:<model>" }),
    chain: t.string({ nullable: true }),
    model: t.string({ nullable: true }),
    day: t.string({ nullable: true, description: "YYYY-MM-DD, UTC" }),
    tenantId: t.id({ nullable: true }),
    calls: t.field({ type: "SafeInt" }),
    inputTokens: t.field({ type: "SafeInt" }),
    outputTokens: t.field({ type: "SafeInt" }),
    redactions: t.field({ type: "SafeInt", description: "Matches replaced by redaction before the calls were sent." }),
    costUsd: t.float({
      nullable: true,
      description: "USD for the tokens of models with a configured price (per 1M input and output tokens).",
    }),
    unpricedTokens: t.field({ type: "SafeInt", description: "Tokens of models without a price, not included in costUsd." }),
  }),
});

const UsageSummary = builder.simpleObject("ModelUsageSummary", {
  fields: (t) => ({
    rows: t.field({ type: [UsageRow] }),
    calls: t.field({ type: "SafeInt" }),
    inputTokens: t.field({ type: "SafeInt" }),
    outputTokens: t.field({ type: "SafeInt" }),
    redactions: t.field({ type: "SafeInt", description: "Matches replaced by redaction before the calls were sent." }),
    costUsd: t.float({
      nullable: true,
      description: "USD for the tokens of models with a configured price (per 1M input and output tokens).",
    }),
    unpricedTokens: t.field({ type: "SafeInt", description: "Tokens of models without a price, not included in costUsd." }),
  }),
});

const BudgetStatusRef = builder.simpleObject("BudgetStatus", {
  description: "This tenant against its monthly token budget (calendar month, UTC).",
  fields: (t) => ({
    spent: t.field({ type: "SafeInt", description: "Input plus output tokens of memory work this period." }),
    limit: t.int({ nullable: true, description: "The limit that applies: the lower of the tenant's monthlyTokenBudget and the server's ENGRAM_MONTHLY_TOKEN_BUDGET. Null: no limit." }),
    periodStart: t.field({ type: "DateTime" }),
    periodEnd: t.field({ type: "DateTime" }),
    paused: t.boolean({ description: "Background memory work is paused until the period rolls over or the limit is raised." }),
    pausedSince: t.field({ type: "DateTime", nullable: true, description: "When the limit was first reached this period." }),
  }),
});

builder.queryFields((t) => ({
  modelUsage: t.field({
    type: UsageSummary,
    authScopes: { reader: true },
    description:
      "Tokens and cost of memory work by this tenant over [from, to), grouped (by default per purpose, chain and model).",
    args: {
      from: t.arg({ type: "DateTime" }),
      to: t.arg({ type: "DateTime" }),
      groupBy: t.arg({ type: [UsageGroupEnum] }),
    },
    resolve: async (_root, args, ctx) => {
      const db = ctx.db;
      const { prices } = await loadTenantSettings(db);
      return modelUsageReport(db, args, prices);
    },
  }),
  budgetStatus: t.field({
    type: BudgetStatusRef,
    authScopes: { reader: true },
    resolve: (_root, _args, ctx) => ctx.deps.models.budget(ctx.db.$tenantId()),
  }),
}));
