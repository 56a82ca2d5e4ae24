import { builder } from "../builder.ts";
import { LIMITS } from "../limits.ts";
import type { CustomPattern } from "../governance/redaction.ts";
import {
  auditChangesShown,
  effectiveModelName,
  loadTenantSettings,
  updateTenantSettings,
  type EffectiveSettings,
  type ModelPrice,
  type ModelRole,
  type StoredRoute,
} from "../governance/settings.ts";

type RouteView = { role: ModelRole; route: StoredRoute | undefined };

/** The server's base URL as a tenant admin may see it: scheme, host and port only. */
function serverOrigin(url: string | undefined): string | null {
  return url ? new URL(url).origin : null;
}

const ModelRouteSettings = builder.objectRef<RouteView>("ModelRouteSettings").implement({
  description: "One role's model route. Unset fields fall back to the server's defaults; the API key is never shown.",
  fields: (t) => ({
    baseUrl: t.string({ nullable: true, description: "This tenant's base URL, if set.", resolve: (v) => v.route?.baseUrl ?? null }),
    model: t.string({ nullable: true, description: "This tenant's model name, if set.", resolve: (v) => v.route?.model ?? null }),
    hasApiKey: t.boolean({
      description: "Whether this tenant has its own API key for the role (stored encrypted).",
      resolve: (v) => Boolean(v.route?.apiKeyEncrypted),
    }),
    effectiveBaseUrl: t.string({
      nullable: true,
      description:
        "The base URL calls go to: this tenant's, else the server's origin (null: the provider's default). " +
        "The server's URL is shown without credentials, path or query.",
      resolve: (v, _args, ctx) => v.route?.baseUrl ?? serverOrigin(ctx.deps.env.OPENAI_BASE_URL),
    }),
    effectiveModel: t.string({
      nullable: true,
      description:
        "The model this role's calls use; null when they are off (the tenant set neither a base URL nor a key " +
        "for it, and the server has neither OPENAI_API_KEY nor OPENAI_BASE_URL). Recall embeddings made by the " +
        "offline encoder name it.",
      resolve: (v, _args, ctx) => effectiveModelName(ctx.deps.env, v.role, v.route),
    }),
  }),
});

const ModelRouting = builder.objectRef<EffectiveSettings["modelRouting"]>("ModelRouting").implement({
  fields: (t) => ({
    cheap: t.field({ type: ModelRouteSettings, resolve: (r) => ({ role: "cheap" as const, route: r.cheap }) }),
    compaction: t.field({ type: ModelRouteSettings, resolve: (r) => ({ role: "compaction" as const, route: r.compaction }) }),
    embedding: t.field({ type: ModelRouteSettings, resolve: (r) => ({ role: "embedding" as const, route: r.embedding }) }),
  }),
});

const CompactionSettings = builder.simpleObject("CompactionSettings", {
  fields: (t) => ({
    minEvents: t.int({ description: "A bucket needs at least this many uncompressed events." }),
    olderThanDays: t.int({ description: "Only events older than this many days are compacted." }),
    schedule: t.string({ description: "Cron expression (UTC) of this tenant's compaction run." }),
  }),
});

const RedactionDetectors = builder.simpleObject("RedactionDetectors", {
  description: "Built-in detectors; each replaces its matches with a typed placeholder.",
  fields: (t) => ({
    email: t.boolean({ description: "[EMAIL]" }),
    phone: t.boolean({ description: "[PHONE]" }),
    card: t.boolean({ description: "[CARD]: payment card numbers passing the Luhn check" }),
    iban: t.boolean({ description: "[IBAN]: IBANs passing the mod-97 check" }),
    secret: t.boolean({ description: "[SECRET]: API keys, tokens, JWTs, private keys, long random strings" }),
    ip: t.boolean({ description: "[IP]: IPv4 and IPv6 addresses" }),
  }),
});

const CustomRedactionPattern = builder.objectRef<CustomPattern>("CustomRedactionPattern").implement({
  fields: (t) => ({
    name: t.exposeString("name"),
    pattern: t.exposeString("pattern"),
    flags: t.exposeString("flags"),
    placeholder: t.exposeString("placeholder"),
  }),
});

const RedactionSettings = builder.objectRef<EffectiveSettings["redaction"]>("RedactionSettings").implement({
  fields: (t) => ({
    detectors: t.field({ type: RedactionDetectors, resolve: (r) => r.detectors }),
    custom: t.field({ type: [CustomRedactionPattern], resolve: (r) => r.custom }),
  }),
});

const ModelPriceRef = builder.objectRef<ModelPrice & { model: string }>("ModelPrice").implement({
  description: "USD per 1M tokens.",
  fields: (t) => ({
    model: t.exposeString("model"),
    inputPerMillion: t.exposeFloat("inputPerMillion"),
    outputPerMillion: t.exposeFloat("outputPerMillion"),
  }),
});

const TenantSettingsRef = builder.objectRef<EffectiveSettings>("TenantSettings").implement({
  description: "This tenant's memory settings; changes apply from the next job or turn.",
  fields: (t) => ({
    retentionDays: t.exposeInt("retentionDays", { description: "Recall snippets and facts older than this are removed; 0 keeps them until forgotten." }),
    forgetDeletesMessages: t.exposeBoolean("forgetDeletesMessages", {
      description: "Forgetting a user, or what they name, also deletes their raw messages.",
    }),
    compaction: t.field({ type: CompactionSettings, resolve: (s) => s.compaction }),
    monthlyTokenBudget: t.int({
      nullable: true,
      description:
        "Input plus output tokens of memory work per calendar month (UTC), as the tenant set it; null: none of its own. The server's ENGRAM_MONTHLY_TOKEN_BUDGET caps it either way (budgetStatus.limit is what applies).",
      resolve: (s) => s.monthlyTokenBudget,
    }),
    modelCallsPerRequest: t.int({
      nullable: true,
      description:
        "Model calls (chat and embeddings) one request may make, over all its fields; null: the server's ENGRAM_MODEL_CALLS_PER_REQUEST, which also caps this.",
      resolve: (s) => s.modelCallsPerRequest,
    }),
    modelRouting: t.field({ type: ModelRouting, resolve: (s) => s.modelRouting }),
    redaction: t.field({ type: RedactionSettings, resolve: (s) => s.redaction }),
    prices: t.field({
      type: [ModelPriceRef],
      resolve: (s) => Object.entries(s.prices).map(([model, price]) => ({ model, ...price })),
    }),
    updatedAt: t.field({ type: "DateTime", nullable: true, resolve: (s) => s.updatedAt }),
  }),
});

const ModelRouteInput = builder.inputType("ModelRouteInput", {
  description: "Absent fields stay as they are; null resets a field to the server default (apiKey: null removes the key).",
  fields: (t) => ({
    baseUrl: t.string(),
    model: t.string(),
    apiKey: t.string({ description: "Stored encrypted (needs ENGRAM_SECRET on the server); never returned." }),
  }),
});

const ModelRoutingInput = builder.inputType("ModelRoutingInput", {
  description: "Per role; null removes the tenant's route for that role.",
  fields: (t) => ({
    cheap: t.field({ type: ModelRouteInput }),
    compaction: t.field({ type: ModelRouteInput }),
    embedding: t.field({ type: ModelRouteInput }),
  }),
});

const CompactionSettingsInput = builder.inputType("CompactionSettingsInput", {
  fields: (t) => ({ minEvents: t.int(), olderThanDays: t.int(), schedule: t.string() }),
});

const RedactionDetectorsInput = builder.inputType("RedactionDetectorsInput", {
  fields: (t) => ({
    email: t.boolean(),
    phone: t.boolean(),
    card: t.boolean(),
    iban: t.boolean(),
    secret: t.boolean(),
    ip: t.boolean(),
  }),
});

const CustomRedactionPatternInput = builder.inputType("CustomRedactionPatternInput", {
  fields: (t) => ({
    name: t.string({ required: true }),
    pattern: t.string({
      required: true,
      description: "An RE2 regular expression (matched in linear time; no backreferences or lookarounds).",
    }),
    flags: t.string({ description: "Any of i, m, s, u." }),
    placeholder: t.string({ description: "Default: [NAME]." }),
  }),
});

const RedactionSettingsInput = builder.inputType("RedactionSettingsInput", {
  fields: (t) => ({
    detectors: t.field({ type: RedactionDetectorsInput }),
    custom: t.field({ type: [CustomRedactionPatternInput], description: "Replaces the whole list." }),
  }),
});

const ModelPriceInput = builder.inputType("ModelPriceInput", {
  fields: (t) => ({
    model: t.string({ required: true }),
    inputPerMillion: t.float({ required: true }),
    outputPerMillion: t.float({ required: true }),
  }),
});

const UpdateTenantSettingsInput = builder.inputType("UpdateTenantSettingsInput", {
  description: "Absent fields stay as they are.",
  fields: (t) => ({
    retentionDays: t.int(),
    forgetDeletesMessages: t.boolean(),
    compaction: t.field({ type: CompactionSettingsInput }),
    monthlyTokenBudget: t.int({ description: "null removes the tenant's own limit (the server's ENGRAM_MONTHLY_TOKEN_BUDGET, when set, still applies)." }),
    modelCallsPerRequest: t.int({ description: "1–1000; null goes back to the server's limit (which caps it either way)." }),
    modelRouting: t.field({ type: ModelRoutingInput }),
    redaction: t.field({ type: RedactionSettingsInput }),
    prices: t.field({ type: [ModelPriceInput], description: "Replaces the whole price table." }),
  }),
});

builder.prismaObject("AuditLog", {
  description: "One administrative change: which key made it, what changed and when. Secrets are never shown.",
  fields: (t) => ({
    id: t.exposeID("id"),
    action: t.exposeString("action"),
    apiKeyId: t.exposeID("apiKeyId", { nullable: true }),
    changes: t.field({
      type: "JSON",
      description: "{ field: { from, to } }",
      // Entries written before credentials in URLs were refused show without them.
      resolve: (entry) => auditChangesShown(entry.changes),
    }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

builder.queryFields((t) => ({
  tenantSettings: t.field({
    type: TenantSettingsRef,
    authScopes: { admin: true },
    resolve: (_root, _args, ctx) => loadTenantSettings(ctx.db),
  }),
  auditLog: t.prismaConnection({
    type: "AuditLog",
    cursor: "id",
    authScopes: { admin: true },
    defaultSize: 20,
    maxSize: LIMITS.pageMax,
    description: "Administrative changes, newest first.",
    resolve: (query, _root, _args, ctx) =>
      ctx.db.auditLog.findMany({ ...query, orderBy: [{ createdAt: "desc" }, { id: "desc" }] }),
  }),
}));

builder.mutationFields((t) => ({
  updateTenantSettings: t.field({
    type: TenantSettingsRef,
    authScopes: { admin: true },
    description: "Changes this tenant's settings; recorded in the audit log. Applies from the next job or turn.",
    args: { input: t.arg({ type: UpdateTenantSettingsInput, required: true }) },
    resolve: (_root, { input }, ctx) =>
      updateTenantSettings(ctx.db, { apiKeyId: ctx.principal.apiKeyId, secret: ctx.deps.env.ENGRAM_SECRET }, input, ctx.deps.env),
  }),
}));
