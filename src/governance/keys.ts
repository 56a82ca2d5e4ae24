import { createHash, randomBytes } from "node:crypto";
import { z } from "zod";
import { forTenant, type Db, type TenantDb } from "../db.ts";
import { notFound } from "../errors.ts";
import { parseInput } from "../errors.ts";
import type { Role } from "../generated/prisma/client.ts";

export type Principal = { tenantId: string; apiKeyId: string; role: Role };

const KEY_PREFIX = "egm_";

export function hashKey(key: string): string {
  return createHash("sha256").update(key).digest("hex");
}

const createTenantInput = z.object({ name: z.string().trim().min(1).max(200) });
const createKeyInput = z.object({
  role: z.enum(["ADMIN", "WRITER", "READER"]),
  name: z.string().max(200).default(""),
});

/**
 * Makes an API key; only its sha256 is stored (keys are 256 random bits, so a slow hash adds
 * nothing). The key itself is returned once.
 */
export async function createApiKey(db: TenantDb, input: z.input<typeof createKeyInput>) {
  const { role, name } = parseInput(createKeyInput, input);
  const tenantId = db.$tenantId();
  const key = KEY_PREFIX + randomBytes(32).toString("base64url");
  const row = await db.apiKey.create({
    data: { tenantId, role, name, hash: hashKey(key), prefix: key.slice(0, 10) },
  });
  return { key, apiKey: row };
}

/** A tenant with its settings row and first admin key. */
export async function createTenant(db: Db, input: z.input<typeof createTenantInput>) {
  const { name } = parseInput(createTenantInput, input);
  const tenant = await db.tenant.create({ data: { name, settings: { create: {} } } });
  const { key } = await createApiKey(forTenant(db, tenant.id), { role: "ADMIN", name: "first admin" });
  return { tenant, adminKey: key };
}

/** First start of an empty store: one tenant and its admin key, or null when tenants exist. */
export async function bootstrapFirstTenant(db: Db) {
  if ((await db.tenant.count()) > 0) return null;
  return createTenant(db, { name: "default" });
}

/** Resolves `Bearer <key>` to who is calling, or null for a missing, unknown or revoked key. */
export async function authenticate(db: Db, authorization: string | null | undefined) {
  const match = /^Bearer\s+(\S+)$/i.exec(authorization?.trim() ?? "");
  if (!match?.[1].startsWith(KEY_PREFIX)) return null;
  // One statement per request: the key, its revocation and its tenant's state together.
  const row = await db.apiKey.findFirst({
    where: { hash: hashKey(match[1]), revokedAt: null, tenant: { active: true } },
    select: { id: true, tenantId: true, role: true },
  });
  if (!row) return null;
  return { tenantId: row.tenantId, apiKeyId: row.id, role: row.role } satisfies Principal;
}

/** Revokes one of the tenant's keys (again is fine); the key row as it is now. */
export async function revokeApiKey(db: TenantDb, id: string) {
  const { count } = await db.apiKey.updateMany({ where: { id, revokedAt: null }, data: { revokedAt: new Date() } });
  const key = await db.apiKey.findUnique({ where: { id } });
  if (!key || (count === 0 && !key.revokedAt)) throw notFound("API key", id);
  return key;
}
