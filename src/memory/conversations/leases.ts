import type { TenantDb } from "../../db.ts";

/**
 * A running holder renews its lease every quarter of this, so a slow model never loses it; a
 * crashed worker's lease runs out within this time, and its conversation's work goes on.
 */
export const LEASE_MS = 120_000;

export type ConversationLease = "summaryLeaseUntil" | "extractionLeaseUntil";

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
  const now = new Date();
  const { count: leased } = await db.conversation.updateMany({
    where: { id: conversationId, OR: [{ [lease]: null }, { [lease]: { lt: now } }] },
    data: { [lease]: new Date(now.getTime() + LEASE_MS) },
  });
  if (!leased) {
    return (await db.conversation.count({ where: { id: conversationId } })) ? { status: "BUSY" } : { status: "GONE" };
  }
  // Renewals are not chained: a slow store must not hold the next one back.
  const renewals = new Set<Promise<unknown>>();
  const renew = setInterval(() => {
    const renewal = db.conversation
      .updateMany({ where: { id: conversationId }, data: { [lease]: new Date(Date.now() + LEASE_MS) } })
      .catch(() => {});
    renewals.add(renewal);
    void renewal.finally(() => renewals.delete(renewal));
  }, LEASE_MS / 4);
  try {
    return await work();
  } finally {
    clearInterval(renew);
    await Promise.all(renewals); // a renewal still in flight must not land after the release
    await db.conversation.updateMany({ where: { id: conversationId }, data: { [lease]: null } });
  }
}
