import type { TenantDb } from "../../db.ts";

/** Longer than any rewrite or extraction should take; a crashed worker's lease simply runs out. */
const LEASE_MS = 5 * 60_000;

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
  try {
    return await work();
  } finally {
    await db.conversation.updateMany({ where: { id: conversationId }, data: { [lease]: null } });
  }
}
