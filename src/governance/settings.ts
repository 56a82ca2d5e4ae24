import type { Env } from "../env.ts";
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from "node:crypto";
import { CronExpressionParser } from "cron-parser";
import { z } from "zod";
import type { TenantDb } from "../db.ts";
import { OFFLINE_MODEL } from "../embeddings/offline.ts";
import { badInput, EngramError, parseInput } from "../errors.ts";
import type { Prisma, TenantSettings as SettingsRow } from "../generated/prisma/client.ts";
import { baseUrlProblem, egressPolicy, withoutCredentials } from "../models/egress.ts";
import {
  customPatternProblem,
  DEFAULT_REDACTION,
  DETECTORS,
  type CustomPattern,
  type Detector,
  type RedactionRules,
} from "./redaction.ts";

export const MODEL_ROLES = ["cheap", "compaction", "embedding"] as const;
export type ModelRole = (typeof MODEL_ROLES)[number];

/** A tenant's own route for one role; unset fields fall back to the server's defaults. */
export type StoredRoute = { baseUrl?: string; model?: string; apiKeyEncrypted?: string };
export type ModelPrice = { inputPerMillion: number; outputPerMillion: number };

/** A tenant's settings with every default filled in: what jobs and model calls obey. */
export type EffectiveSettings = {
  retentionDays: number;
  /** Forgetting a user, or what they name, also deletes their raw messages (default on). */
  forgetDeletesMessages: boolean;
  compaction: { minEvents: number; olderThanDays: number; schedule: string };
  monthlyTokenBudget: number | null;
  /** Model calls (chat + embeddings) one request may make; null: the server's limit. */
  modelCallsPerRequest: number | null;
  budgetPausedSince: Date | null;
  modelRouting: Partial<Record<ModelRole, StoredRoute>>;
  redaction: RedactionRules;
  prices: Record<string, ModelPrice>;
  updatedAt: Date | null;
};

/** The server-wide default model name for a role (always set; the route may still be off). */
export function defaultModelName(env: Env, role: ModelRole): string {
  if (role === "embedding") return env.ENGRAM_EMBEDDING_MODEL;
  return role === "compaction" ? env.ENGRAM_COMPACTION_MODEL : env.ENGRAM_CHEAP_MODEL;
}

/** Whether recall embeds through OpenAI (or a compatible base URL) rather than the offline encoder. */
export function usesOpenAIEmbeddings(env: Env): boolean {
  if (env.ENGRAM_EMBEDDINGS === "offline") return false;
  if (env.ENGRAM_EMBEDDINGS === "openai") return true;
  return Boolean(env.OPENAI_API_KEY || env.OPENAI_BASE_URL);
}

/** Whether the server routes a role's calls by itself: it has a key or base URL (and, for embeddings, is not forced offline). */
export function serverRoutes(env: Env, role: ModelRole): boolean {
  if (!env.OPENAI_API_KEY && !env.OPENAI_BASE_URL) return false;
  return !(role === "embedding" && env.ENGRAM_EMBEDDINGS === "offline");
}

/**
 * The model a role's calls go to, as the model and embeddings providers choose it: null when
 * there is no route (the tenant set neither a base URL nor a key, and the server routes none);
 * the offline encoder's for recall embeddings it makes (with no route, it makes them all).
 */
export function effectiveModelName(env: Env, role: ModelRole, route: StoredRoute | undefined): string | null {
  const routed = Boolean(route?.baseUrl || route?.apiKeyEncrypted || serverRoutes(env, role));
  // Recall always embeds: with no route to call, the offline encoder does it.
  if (role === "embedding" && (!usesOpenAIEmbeddings(env) || !routed)) return OFFLINE_MODEL;
  if (!routed) return null;
  return route?.model ?? defaultModelName(env, role);
}

export const DEFAULT_COMPACTION_SCHEDULE = "17 6 * * *";

// ---------------------------------------------------------------------------------------------
// Tenant API keys at rest: AES-256-GCM under a key derived from ENGRAM_SECRET, bound to the
// tenant and role so a ciphertext copied to another tenant's row does not decrypt.

const CIPHER_VERSION = "v1";

function keyFrom(secret: string): Buffer {
  return Buffer.from(hkdfSync("sha256", secret, "engram", "tenant-model-api-keys", 32));
}

export function encryptApiKey(secret: string, plain: string, context: string): string {
  const iv = randomBytes(12);
  const cipher = createCipheriv("aes-256-gcm", keyFrom(secret), iv);
  cipher.setAAD(Buffer.from(context));
  const data = Buffer.concat([cipher.update(plain, "utf8"), cipher.final()]);
  return [CIPHER_VERSION, iv, cipher.getAuthTag(), data].map((p) => (typeof p === "string" ? p : p.toString("base64url"))).join(":");
}

export function decryptApiKey(secret: string, sealed: string, context: string): string {
  const [version, iv, tag, data] = sealed.split(":");
  if (version !== CIPHER_VERSION || !iv || !tag || !data) throw new Error("unreadable encrypted API key");
  const decipher = createDecipheriv("aes-256-gcm", keyFrom(secret), Buffer.from(iv, "base64url"));
  decipher.setAAD(Buffer.from(context));
  decipher.setAuthTag(Buffer.from(tag, "base64url"));
  return Buffer.concat([decipher.update(Buffer.from(data, "base64url")), decipher.final()]).toString("utf8");
}

export const apiKeyContext = (tenantId: string, role: ModelRole) => `${tenantId}:${role}`;

// ---------------------------------------------------------------------------------------------
// Reading

const storedRoute = z
  .object({
    // Credentials stored before they were refused are never used or shown.
    baseUrl: z.string().transform(withoutCredentials).optional(),
    model: z.string().optional(),
    apiKeyEncrypted: z.string().optional(),
  })
  .catch({});

function readRouting(json: unknown): Partial<Record<ModelRole, StoredRoute>> {
  const routing: Partial<Record<ModelRole, StoredRoute>> = {};
  const object = (json ?? {}) as Record<string, unknown>;
  for (const role of MODEL_ROLES) {
    if (object[role] && typeof object[role] === "object") routing[role] = storedRoute.parse(object[role]);
  }
  return routing;
}

function readRedaction(json: unknown): RedactionRules {
  const object = (json ?? {}) as { detectors?: Record<string, unknown>; custom?: unknown };
  const detectors = { ...DEFAULT_REDACTION.detectors };
  for (const detector of DETECTORS) {
    if (typeof object.detectors?.[detector] === "boolean") detectors[detector] = object.detectors[detector] as boolean;
  }
  const custom = Array.isArray(object.custom) ? (object.custom as CustomPattern[]) : [];
  return { detectors, custom };
}

function readPrices(json: unknown): Record<string, ModelPrice> {
  // Model names are the tenant's words: "constructor" or "toString" are names like any other.
  const prices: Record<string, ModelPrice> = Object.create(null);
  for (const [model, price] of Object.entries((json ?? {}) as Record<string, Partial<ModelPrice>>)) {
    if (typeof price?.inputPerMillion === "number" && typeof price?.outputPerMillion === "number") {
      prices[model] = { inputPerMillion: price.inputPerMillion, outputPerMillion: price.outputPerMillion };
    }
  }
  return prices;
}

export function effectiveSettings(row: SettingsRow | null): EffectiveSettings {
  return {
    retentionDays: row?.retentionDays ?? 180,
    forgetDeletesMessages: row?.forgetDeletesMessages ?? true,
    compaction: {
      minEvents: row?.compactionMinEvents ?? 3,
      olderThanDays: row?.compactionAgeDays ?? 90,
      schedule: row?.compactionSchedule ?? DEFAULT_COMPACTION_SCHEDULE,
    },
    monthlyTokenBudget: row?.monthlyTokenBudget ?? null,
    modelCallsPerRequest: row?.modelCallsPerRequest ?? null,
    budgetPausedSince: row?.budgetPausedSince ?? null,
    modelRouting: readRouting(row?.modelRouting),
    redaction: readRedaction(row?.redaction),
    prices: readPrices(row?.prices),
    updatedAt: row?.updatedAt ?? null,
  };
}

/** The tenant's settings as stored now, read from the database. */
async function readTenantSettings(db: TenantDb): Promise<EffectiveSettings> {
  return effectiveSettings(await db.tenantSettings.findUnique({ where: { tenantId: db.$tenantId() } }));
}

/**
 * How long this process reuses a tenant's settings. A request or job reads them several times
 * (each model call's route, redaction and budget): without this, six reads per `context`. A
 * change made here applies at once (settingsChanged); one made by another instance or the CLI
 * within this long, as a revoked key does.
 */
export const SETTINGS_TTL_MS = 1_000;

const settingsCache = new WeakMap<TenantDb, { until: number; generation: number; settings: Promise<EffectiveSettings> }>();
// Bumped per tenant by every change this process makes: a read running across one is not kept.
const generations = new Map<string, number>();

/** The tenant's settings as they are now (at most SETTINGS_TTL_MS old); changes need no restart. */
export function loadTenantSettings(db: TenantDb): Promise<EffectiveSettings> {
  const tenantId = db.$tenantId();
  const generation = generations.get(tenantId) ?? 0;
  const cached = settingsCache.get(db);
  if (cached && cached.generation === generation && cached.until > performance.now()) return cached.settings;
  const settings = readTenantSettings(db);
  settingsCache.set(db, { until: performance.now() + SETTINGS_TTL_MS, generation, settings });
  settings.catch(() => settingsCache.get(db)?.settings === settings && settingsCache.delete(db));
  return settings;
}

/** After a write to a tenant's settings row: this process reads them afresh. */
export function settingsChanged(tenantId: string) {
  generations.set(tenantId, (generations.get(tenantId) ?? 0) + 1);
}

// ---------------------------------------------------------------------------------------------
// Changing

const cron = z
  .string()
  .trim()
  .refine((value) => {
    if (value.split(/\s+/).length !== 5) return false;
    try {
      CronExpressionParser.parse(value, { tz: "UTC" });
      return true;
    } catch {
      return false;
    }
  }, "must be a five-field cron expression (minute hour day month weekday, UTC)");

const routeInput = z
  .object({
    baseUrl: z
      .string()
      .trim()
      .url()
      .regex(/^https?:\/\//, "must be an http(s) URL")
      .max(500)
      .refine((url) => !/^https?:\/\/[^/?#]*@/.test(url), "must not contain credentials (user:password@); set apiKey instead")
      .nullish(),
    model: z.string().trim().min(1).max(200).nullish(),
    /** null clears the tenant's key; absent leaves it as it is. */
    apiKey: z.string().trim().min(1).max(1_000).nullish(),
  })
  .strict();

const customPatternInput = z
  .object({
    name: z.string().trim().regex(/^[A-Za-z][A-Za-z0-9_-]{0,39}$/, "letters, digits, - and _, starting with a letter"),
    pattern: z.string(),
    flags: z.string().default(""),
    placeholder: z.string().trim().min(1).max(40).nullish(),
  })
  .superRefine((value, ctx) => {
    const problem = customPatternProblem(value.pattern, value.flags);
    if (problem) ctx.addIssue({ code: "custom", path: ["pattern"], message: problem });
  })
  .transform(
    (value): CustomPattern => ({
      name: value.name,
      pattern: value.pattern,
      flags: value.flags,
      placeholder: value.placeholder ?? `[${value.name.toUpperCase()}]`,
    }),
  );

const detectorsInput = z.object(Object.fromEntries(DETECTORS.map((d) => [d, z.boolean().nullish()])) as Record<Detector, z.ZodOptional<z.ZodNullable<z.ZodBoolean>>>).strict();

const usd = z.number().finite().min(0).max(10_000);

export const updateSettingsInput = z
  .object({
    retentionDays: z.number().int().min(0).max(36_500).nullish(),
    forgetDeletesMessages: z.boolean().nullish(),
    compaction: z
      .object({
        minEvents: z.number().int().min(2).max(1_000).nullish(),
        olderThanDays: z.number().int().min(1).max(36_500).nullish(),
        schedule: cron.nullish(),
      })
      .strict()
      .nullish(),
    /** null removes the limit; absent leaves it as it is. */
    monthlyTokenBudget: z.number().int().min(0).nullish(),
    /** null goes back to the server's limit; the server's limit caps it either way. */
    modelCallsPerRequest: z.number().int().min(1).max(1_000).nullish(),
    modelRouting: z
      .object({ cheap: routeInput.nullish(), compaction: routeInput.nullish(), embedding: routeInput.nullish() })
      .strict()
      .nullish(),
    redaction: z
      .object({
        detectors: detectorsInput.nullish(),
        custom: z
          .array(customPatternInput)
          .max(50)
          .refine((list) => new Set(list.map((p) => p.name)).size === list.length, "custom pattern names must be unique")
          .nullish(),
      })
      .strict()
      .nullish(),
    /** Replaces the whole price table. */
    prices: z
      .array(
        z
          .object({
            // The table is stored as a JSON object keyed by model, where this one name cannot be a key.
            model: z.string().trim().min(1).max(200).refine((model) => model !== "__proto__", "`__proto__` cannot be priced"),
            inputPerMillion: usd,
            outputPerMillion: usd,
          })
          .strict(),
      )
      .max(200)
      .refine((list) => new Set(list.map((p) => p.model)).size === list.length, "one price per model")
      .nullish(),
  })
  .strict();

export type UpdateSettingsInput = z.input<typeof updateSettingsInput>;

type Change = { from: unknown; to: unknown };

/** What an audit entry shows for a route: never the key, only whether one is set. */
const auditRoute = (route: StoredRoute | undefined) =>
  route ? { baseUrl: route.baseUrl ? withoutCredentials(route.baseUrl) : null, model: route.model ?? null, apiKey: route.apiKeyEncrypted ? "[set]" : null } : null;

/** Audit changes as shown: entries written before credentials in URLs were refused show without them. */
export function auditChangesShown(value: unknown): unknown {
  if (typeof value === "string") return /^https?:\/\/[^/?#]*@/.test(value) ? withoutCredentials(value) : value;
  if (Array.isArray(value)) return value.map(auditChangesShown);
  if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, auditChangesShown(v)]));
  return value;
}

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

/**
 * Validates and applies a settings change for the caller's tenant, and records it in the audit
 * log with the key that made it. Fields left out stay as they are; invalid input writes nothing.
 */
export async function updateTenantSettings(
  db: TenantDb,
  actor: { apiKeyId: string; secret: string | undefined },
  rawInput: unknown,
  /** Where model calls may go: a base URL plainly outside it is refused here, before any call. */
  egressEnv: { ENGRAM_MODEL_HOST_ALLOWLIST?: string; OPENAI_BASE_URL?: string } = {},
): Promise<EffectiveSettings> {
  const input = parseInput(updateSettingsInput, rawInput);
  const egress = egressPolicy(egressEnv);
  for (const role of MODEL_ROLES) {
    const baseUrl = input.modelRouting?.[role]?.baseUrl;
    const problem = baseUrl ? baseUrlProblem(egress, baseUrl) : null;
    if (problem) throw badInput(`Invalid input: modelRouting.${role}.baseUrl: ${problem}`, { path: `modelRouting.${role}.baseUrl` });
  }
  const tenantId = db.$tenantId();
  const outcome = await db.$transaction(async (tx) => {
    // Changes of one tenant's settings take turns, each computed against what the one before it
    // wrote: two admins saving together (one switching a detector, the other a route) each read
    // the same row and the second write silently undid the first, whose audit row still said done.
    await tx.$executeRaw`SELECT pg_advisory_xact_lock(${SETTINGS_LOCK}::int, hashtext(${tenantId}))`;
    const current = effectiveSettings(await tx.tenantSettings.findUnique({ where: { tenantId } }));

    const data: Prisma.TenantSettingsUncheckedUpdateInput = {};
    const changes: Record<string, Change> = {};
    const set = <K extends keyof Prisma.TenantSettingsUncheckedUpdateInput>(
      column: K,
      label: string,
      from: unknown,
      to: Prisma.TenantSettingsUncheckedUpdateInput[K],
      shown: unknown = to,
    ) => {
      if (same(from, shown)) return;
      data[column] = to;
      changes[label] = { from, to: shown };
    };

    if (input.retentionDays != null) set("retentionDays", "retentionDays", current.retentionDays, input.retentionDays);
    if (input.forgetDeletesMessages != null) {
      set("forgetDeletesMessages", "forgetDeletesMessages", current.forgetDeletesMessages, input.forgetDeletesMessages);
    }
    if (input.compaction?.minEvents != null)
      set("compactionMinEvents", "compaction.minEvents", current.compaction.minEvents, input.compaction.minEvents);
    if (input.compaction?.olderThanDays != null)
      set("compactionAgeDays", "compaction.olderThanDays", current.compaction.olderThanDays, input.compaction.olderThanDays);
    if (input.compaction?.schedule != null)
      set("compactionSchedule", "compaction.schedule", current.compaction.schedule, input.compaction.schedule);
    if (input.modelCallsPerRequest !== undefined) {
      set("modelCallsPerRequest", "modelCallsPerRequest", current.modelCallsPerRequest, input.modelCallsPerRequest);
    }
    if (input.monthlyTokenBudget !== undefined) {
      set("monthlyTokenBudget", "monthlyTokenBudget", current.monthlyTokenBudget, input.monthlyTokenBudget);
    }

    if (input.modelRouting) {
      const routing = { ...current.modelRouting };
      for (const role of MODEL_ROLES) {
        const change = input.modelRouting[role];
        if (change === undefined) continue;
        const before = routing[role];
        if (change === null) {
          delete routing[role];
        } else {
          const next: StoredRoute = { ...before };
          if (change.baseUrl !== undefined) next.baseUrl = change.baseUrl ?? undefined;
          if (change.model !== undefined) next.model = change.model ?? undefined;
          if (change.apiKey === null) delete next.apiKeyEncrypted;
          else if (change.apiKey !== undefined) {
            if (!actor.secret) {
              throw badInput(
                "Tenant API keys are stored encrypted, and this server has no ENGRAM_SECRET to encrypt them with. Set ENGRAM_SECRET and restart, or leave apiKey out.",
                { path: `modelRouting.${role}.apiKey` },
              );
            }
            next.apiKeyEncrypted = encryptApiKey(actor.secret, change.apiKey, apiKeyContext(tenantId, role));
          }
          const cleaned = Object.fromEntries(Object.entries(next).filter(([, v]) => v !== undefined)) as StoredRoute;
          if (Object.keys(cleaned).length) routing[role] = cleaned;
          else delete routing[role];
        }
        const after = routing[role];
        const keyChanged = change !== null && change.apiKey !== undefined && change.apiKey !== null;
        if (!same(before, after)) {
          changes[`modelRouting.${role}`] = {
            from: auditRoute(before),
            // A new key shows as "[changed]", so the log tells a rotation apart without revealing it.
            to: after ? { ...auditRoute(after), ...(keyChanged && before?.apiKeyEncrypted ? { apiKey: "[changed]" } : {}) } : null,
          };
        }
      }
      data.modelRouting = routing as Prisma.InputJsonValue;
    }

    if (input.redaction) {
      const next: RedactionRules = {
        detectors: { ...current.redaction.detectors },
        custom: input.redaction.custom ?? current.redaction.custom,
      };
      for (const detector of DETECTORS) {
        const value = input.redaction.detectors?.[detector];
        if (value != null) next.detectors[detector] = value;
      }
      set("redaction", "redaction", current.redaction, next as unknown as Prisma.InputJsonValue);
    }

    if (input.prices) {
      const prices = Object.fromEntries(
        input.prices.map((p) => [p.model, { inputPerMillion: p.inputPerMillion, outputPerMillion: p.outputPerMillion }]),
      );
      set("prices", "prices", current.prices, prices);
    }

    // Only the columns that changed are written; modelRouting is rewritten only when a role did.
    if (!Object.keys(changes).some((label) => label.startsWith("modelRouting."))) delete data.modelRouting;
    if (Object.keys(data).length === 0) return { current, written: false };
    await tx.tenantSettings.upsert({
      where: { tenantId },
      create: { ...(data as Prisma.TenantSettingsUncheckedCreateInput), tenantId },
      update: data,
    });
    await tx.auditLog.create({
      data: { tenantId, apiKeyId: actor.apiKeyId, action: "settings.update", changes: changes as Prisma.InputJsonValue },
    });
    return { current, written: true };
  });
  if (!outcome.written) return outcome.current;
  settingsChanged(tenantId);
  return loadTenantSettings(db);
}

// The first key of the per-tenant advisory lock around a settings change (the second is the
// tenant's hash); any constant that no other two-key advisory lock uses.
const SETTINGS_LOCK = 727_361_003;

/** The route a role resolves to for this tenant, with its key decrypted; used only to call models. */
export function tenantApiKey(
  settings: EffectiveSettings,
  tenantId: string,
  role: ModelRole,
  secret: string | undefined,
): string | undefined {
  const sealed = settings.modelRouting[role]?.apiKeyEncrypted;
  if (!sealed) return undefined;
  if (!secret) {
    throw new EngramError(
      "MODEL_UNAVAILABLE",
      `This tenant's ${role} model key is stored encrypted, but ENGRAM_SECRET is not set; the call was not made.`,
    );
  }
  try {
    return decryptApiKey(secret, sealed, apiKeyContext(tenantId, role));
  } catch {
    throw new EngramError(
      "MODEL_UNAVAILABLE",
      `This tenant's ${role} model key cannot be decrypted with the current ENGRAM_SECRET; set the key again.`,
    );
  }
}
