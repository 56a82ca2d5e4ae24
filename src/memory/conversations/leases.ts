import { appNow, sqlTimestamp, type TenantDb } from "../../db.ts";
import { Prisma } from "../../generated/prisma/client.ts";

/**
 * A running holder renews its lease every quarter of this, so a slow model never loses it; a
 * crashed worker's lease runs out within this time, and its conversation's work goes on.
 */
export const LEASE_MS = 120_000;

export type ConversationLease = "summaryLeaseUntil" | "extractionLeaseUntil" | "gateLeaseUntil";

/**
 * Runs `work` holding one of a conversation's leases, so that kind of work runs once per
 * conversation at a time across workers. The lease is taken, not awaited: BUSY when another
 * worker holds it, GONE when the conversation no longer exists.
 */
export async function underConversationLease<T>(
  db: TenantDb,
  conversationId: string,
  lease: ConversationLease,
  work: () => Promise<T>,
): Promise<T | { status: "BUSY" | "GONE" }> {
  const tenantId = db.$tenantId();
  const column = Prisma.raw(`"${lease}"`);
  // The lease's end as this holder last wrote it: renewals and the release touch the lease only
  // while it still holds that value. One whose renewals failed until it lapsed, and which another
  // worker then took, must neither extend nor clear that worker's lease.
  let held = new Date(Date.now() + LEASE_MS);
  const ours = Prisma.sql`"tenantId" = ${tenantId} AND "id" = ${conversationId}`;
  const now = appNow();
  const [taken] = await db.$queryRaw<{ found: boolean; leased: boolean }[]>`
    WITH found AS (
      SELECT "id" FROM "Conversation" WHERE ${ours}
    ), leased AS (
      UPDATE "Conversation" SET ${column} = ${sqlTimestamp(held)}
      WHERE ${ours} AND (${column} IS NULL OR ${column} < ${now})
      RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM found) AS "found", EXISTS (SELECT 1 FROM leased) AS "leased"`;
  if (!taken.leased) return { status: taken.found ? "BUSY" : "GONE" };
  // Raw statements, one round trip each: Prisma's updateMany wraps its UPDATE in BEGIN/COMMIT, and
  // a turn's extraction takes and gives back a lease on every turn. A renewal waits for the one
  // before it, since it must know what that one wrote.
  let renewing: Promise<unknown> = Promise.resolve();
  const renew = setInterval(() => {
    renewing = renewing.then(async () => {
      const next = new Date(Date.now() + LEASE_MS);
      const renewed = await db.$executeRaw`
        UPDATE "Conversation" SET ${column} = ${sqlTimestamp(next)} WHERE ${ours} AND ${column} = ${sqlTimestamp(held)}`.catch(() => 0);
      if (renewed) held = next;
    });
  }, LEASE_MS / 4);
  // A holder cut off by a shutdown (its store closed under it) must not keep the process alive.
  renew.unref();
  try {
    return await work();
  } finally {
    clearInterval(renew);
    await renewing; // a renewal still in flight must not land after the release
    await db.$executeRaw`UPDATE "Conversation" SET ${column} = NULL WHERE ${ours} AND ${column} = ${sqlTimestamp(held)}`;
  }
}
