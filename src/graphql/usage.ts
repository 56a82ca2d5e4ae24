import { builder, tenantDb } from "../builder.ts";
import { sumModelUsage } from "../memory/usage.ts";

const UsageRow = builder.simpleObject("ModelUsageRow", {
  fields: (t) => ({
    purpose: t.string({ description: "memory:<model>" }),
    chain: t.string(),
    model: t.string(),
    calls: t.int(),
    inputTokens: t.int(),
    outputTokens: t.int(),
  }),
});

const UsageSummary = builder.simpleObject("ModelUsageSummary", {
  fields: (t) => ({
    rows: t.field({ type: [UsageRow] }),
    inputTokens: t.int(),
    outputTokens: t.int(),
  }),
});

builder.queryFields((t) => ({
  modelUsage: t.field({
    type: UsageSummary,
    authScopes: { reader: true },
    description: "Tokens spent on memory work by this tenant over [from, to), per purpose and chain.",
    args: { from: t.arg({ type: "DateTime" }), to: t.arg({ type: "DateTime" }) },
    resolve: (_root, args, ctx) => sumModelUsage(tenantDb(ctx), args),
  }),
}));
