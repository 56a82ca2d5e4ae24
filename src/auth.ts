import { z } from "zod";
import { forTenant, type Db } from "./db.ts";
import { parseInput } from "./errors.ts";
import { createApiKey, hashKey, KEY_PREFIX, type Principal } from "./governance/keys.ts";

/**
 * Who is calling, and the tenants themselves: the few places that must read across tenants
 * (a key's hash names its tenant; a new tenant has none yet), so they take the raw client.
 */

const createTenantInput = z.object({ name: z.string().trim().min(1).max(200) });

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

