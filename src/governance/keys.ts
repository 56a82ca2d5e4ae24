import { createHash, randomBytes } from "node:crypto";
import { z } from "zod";
import type { TenantDb } from "../db.ts";
import { notFound } from "../errors.ts";
import { parseInput } from "../errors.ts";
import type { Role } from "../generated/prisma/client.ts";
import type { Deps } from "../deps.ts";

export type Principal = { tenantId: string; apiKeyId: string; role: Role };

export const KEY_PREFIX = "egm_";

export function hashKey(key: string): string {
  return createHash("sha256").update(key).digest("hex");
}

const createKeyInput = z.object({
  role: z.enum(["ADMIN", "WRITER", "READER"]),
  name: z.string().max(200).default(""),
});

/** Who made or revoked a key, for its audit row: the admin key (none from the CLI or the first start) and the way. */
export type KeyActor = { apiKeyId: string | null; via: "graphql" | "cli" | "first start" };

/** A key's audit row (`apiKey.create`, `apiKey.revoke`): which key, its role, name and prefix; never the key. */
export function keyAuditRow(
  action: "apiKey.create" | "apiKey.revoke",
  key: { id: string; tenantId: string; role: Role; name: string; prefix: string },
  actor: KeyActor,
) {
  return {
    tenantId: key.tenantId,
    apiKeyId: actor.apiKeyId,
    action,
    changes: { target: { apiKeyId: key.id, role: key.role, name: key.name, prefix: key.prefix }, via: actor.via },
  };
}

/**
 * Makes an API key; only its sha256 is stored (keys are 256 random bits, so a slow hash adds
 * nothing). The key itself is returned once. Audited with the key's row, in one transaction:
 * a key that can do anything exists only with the record of who made it.
 */
export async function createApiKey(db: TenantDb, input: z.input<typeof createKeyInput>, actor: KeyActor) {
  const { role, name } = parseInput(createKeyInput, input);
  const { key, stored } = newKey();
  const row = await db.$transaction(async (tx) => {
    const created = await tx.apiKey.create({ data: { tenantId: db.$tenantId(), role, name, ...stored } });
    await tx.auditLog.create({ data: keyAuditRow("apiKey.create", created, actor) });
    return created;
  });
  return { key, apiKey: row };
}

/** A new key, and what its row stores of it (never the key itself). */
export function newKey() {
  const key = KEY_PREFIX + randomBytes(32).toString("base64url");
  return { key, stored: { hash: hashKey(key), prefix: key.slice(0, 10) } };
}

/**
 * Revokes one of the tenant's keys (again is fine); the key row as it is now. Its open WebSocket
 * connections are closed on every instance (the revocation travels on the pubsub).
 */
export async function revokeApiKey(db: TenantDb, id: string, deps: Pick<Deps, "pubsub" | "keys">, actor: KeyActor) {
  const { count, key } = await db.$transaction(async (tx) => {
    const { count } = await tx.apiKey.updateMany({ where: { id, revokedAt: null }, data: { revokedAt: new Date() } });
    const key = await tx.apiKey.findUnique({ where: { id } });
    // Only the revocation that happened is recorded, not a repeat of it.
    if (count > 0 && key) await tx.auditLog.create({ data: keyAuditRow("apiKey.revoke", key, actor) });
    return { count, key };
  });
  if (!key || (count === 0 && !key.revokedAt)) throw notFound("API key", id);
  if (count > 0) {
    // This instance forgets the key now; the others when the announcement reaches them (or their
    // cache's TTL, at most 1 s, runs out).
    deps.keys.revoked(key.id);
    deps.pubsub.publish("apiKeyRevoked", "all", { apiKeyId: key.id });
  }
  return key;
}
