import { z } from "zod";
import type { Db } from "./db.ts";
import { parseInput } from "./errors.ts";
import { hashKey, KEY_PREFIX, keyAuditRow, newKey, type KeyActor, type Principal } from "./governance/keys.ts";
import type { PubSub } from "./pubsub.ts";

/**
 * Who is calling, and the tenants themselves: the few places that must read across tenants
 * (a key's hash names its tenant; a new tenant has none yet), so they take the raw client.
 */

const createTenantInput = z.object({ name: z.string().trim().min(1).max(200) });

/** A tenant with its settings row and first admin key. */
export async function createTenant(db: Db, input: z.input<typeof createTenantInput>) {
  const { name } = parseInput(createTenantInput, input);
  return db.$transaction((tx) => tenantWithAdminKey(tx, name, { apiKeyId: null, via: "cli" }));
}

/** The rows of a new tenant: itself, its settings and its first admin key, audited (in a transaction's client). */
async function tenantWithAdminKey(db: Pick<Db, "tenant" | "apiKey" | "auditLog">, name: string, actor: KeyActor) {
  const tenant = await db.tenant.create({ data: { name, settings: { create: {} } } });
  const { key, stored } = newKey();
  const row = await db.apiKey.create({ data: { tenantId: tenant.id, role: "ADMIN", name: "first admin", ...stored } });
  await db.auditLog.create({ data: keyAuditRow("apiKey.create", row, actor) });
  return { tenant, adminKey: key };
}

// The advisory lock the first start takes (any constant no other one-key advisory lock uses).
const FIRST_TENANT_LOCK = 7_243_101;

/**
 * First start of an empty store: one tenant and its admin key, or null when tenants exist. One
 * transaction under an advisory lock: instances starting together on a new database would each
 * find none and make their own, each printing a key to a tenant of its own.
 */
export async function bootstrapFirstTenant(db: Db) {
  return db.$transaction(async (tx) => {
    await tx.$executeRaw`SELECT pg_advisory_xact_lock(${FIRST_TENANT_LOCK}::bigint)`;
    if ((await tx.tenant.count()) > 0) return null;
    return tenantWithAdminKey(tx, "default", { apiKeyId: null, via: "first start" });
  });
}

// What createApiKey makes: the prefix and 32 random bytes in base64url.
const KEY_SHAPE = new RegExp(`^${KEY_PREFIX}[A-Za-z0-9_-]{43}$`);

/** The key of an `Authorization: Bearer <key>` header, or null when it cannot be one of ours (no lookup then). */
function bearerKey(authorization: string | null | undefined): string | null {
  const match = /^Bearer\s+(\S+)$/i.exec(authorization?.trim() ?? "");
  return match && KEY_SHAPE.test(match[1]) ? match[1] : null;
}

/** Who is calling, and the tenant's own limit of model calls per request (null: the server's). */
export type Caller = Principal & { modelCallsPerRequest: number | null };

/** Resolves a key's hash to who is calling, or null for an unknown or revoked key. */
async function lookUpKey(db: Db, hash: string): Promise<Caller | null> {
  // One statement: the key, its revocation, its tenant's state and the tenant's request limit
  // (Prisma would send the nested settings as statements of their own).
  const [row] = await db.$queryRaw<{ id: string; tenantId: string; role: Principal["role"]; modelCallsPerRequest: number | null }[]>`
    SELECT k."id", k."tenantId", k."role"::text AS "role", s."modelCallsPerRequest"
    FROM "ApiKey" k
    JOIN "Tenant" t ON t."id" = k."tenantId"
    LEFT JOIN "TenantSettings" s ON s."tenantId" = k."tenantId"
    WHERE k."hash" = ${hash} AND k."revokedAt" IS NULL AND t."active"
    LIMIT 1`;
  if (!row) return null;
  return { tenantId: row.tenantId, apiKeyId: row.id, role: row.role, modelCallsPerRequest: row.modelCallsPerRequest };
}

/** Of the given key ids, those not revoked whose tenant is active: one statement. */
export async function liveKeyIds(db: Db, ids: string[]): Promise<string[]> {
  const rows = await db.apiKey.findMany({
    where: { id: { in: ids }, revokedAt: null, tenant: { active: true } },
    select: { id: true },
  });
  return rows.map((row) => row.id);
}

/** Resolves `Bearer <key>` to who is calling, or null for a missing, unknown or revoked key (uncached). */
export async function authenticate(db: Db, authorization: string | null | undefined) {
  const key = bearerKey(authorization);
  return key ? lookUpKey(db, hashKey(key)) : null;
}

export type KeyCache = {
  /** `authenticate`, answered from memory when the key was looked up less than `ttlMs` ago. */
  authenticate(authorization: string | null | undefined): Promise<Caller | null>;
  /** Drops a revoked key at once (the revoking instance; others hear it on the pubsub). */
  revoked(apiKeyId: string): void;
  close(): Promise<void>;
};

type Cached = { principal: Caller | null; until: number };
type Lookup = { answer: Promise<Caller | null>; startedAt: number };

/**
 * Key lookups without a database round trip on every request. An answer is kept at most `ttlMs`
 * (at most 1 s), so a revoked key fails within that on every instance even when the revocation
 * announcement is lost (Redis down); while the pubsub works, a revocation drops the key at once.
 * The TTL runs from when the lookup began, not from its answer, and a request joins a lookup
 * under way only while that is younger than the TTL. Unknown keys are remembered too, apart and
 * bounded, so a flood of made-up keys costs one statement each per TTL and never pushes a live
 * key out of the cache. Concurrent lookups of one key share one statement.
 */
export function createKeyCache(
  db: Db,
  pubsub: Pick<PubSub, "subscribe">,
  options: { ttlMs: number; maxEntries?: number; now?: () => number },
): KeyCache {
  const ttlMs = Math.min(options.ttlMs, 1_000);
  const maxEntries = options.maxEntries ?? 10_000;
  const now = options.now ?? (() => performance.now());
  const byHash = new Map<string, Cached>();
  const unknown = new Map<string, Cached>();
  const inFlight = new Map<string, Lookup>();
  // Bumped by every revocation: a lookup that was running when one arrived is not kept.
  let generation = 0;

  const revoked = (apiKeyId: string) => {
    generation++;
    inFlight.clear();
    for (const [hash, entry] of byHash) if (entry.principal?.apiKeyId === apiKeyId) byHash.delete(hash);
  };
  const revocations = pubsub.subscribe("apiKeyRevoked", "all");
  void (async () => {
    for await (const { apiKeyId } of revocations) revoked(apiKeyId);
  })().catch(() => undefined);

  const remember = (hash: string, entry: Cached) => {
    const cache = entry.principal ? byHash : unknown;
    byHash.delete(hash);
    unknown.delete(hash);
    if (cache.size >= maxEntries) cache.delete(cache.keys().next().value!);
    cache.set(hash, entry);
  };

  const lookUp = (hash: string) => {
    const started = generation;
    const startedAt = now();
    const lookup: Lookup = {
      startedAt,
      answer: lookUpKey(db, hash).then(
        (principal) => {
          if (inFlight.get(hash) === lookup) inFlight.delete(hash);
          if (started === generation) remember(hash, { principal, until: startedAt + ttlMs });
          return principal;
        },
        (error: unknown) => {
          if (inFlight.get(hash) === lookup) inFlight.delete(hash);
          throw error;
        },
      ),
    };
    inFlight.set(hash, lookup);
    return lookup.answer;
  };

  return {
    async authenticate(authorization) {
      const key = bearerKey(authorization);
      if (!key) return null;
      const hash = hashKey(key);
      // Off: every request asks the database (no sharing of concurrent lookups either).
      if (ttlMs === 0) return lookUpKey(db, hash);
      const at = now();
      const cached = byHash.get(hash) ?? unknown.get(hash);
      if (cached && cached.until > at) return cached.principal;
      const running = inFlight.get(hash);
      return running && at - running.startedAt < ttlMs ? running.answer : lookUp(hash);
    },
    revoked,
    async close() {
      await revocations.return?.();
    },
  };
}
