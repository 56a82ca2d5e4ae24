import type { TenantDb } from "../db.ts";
import { notFound } from "../errors.ts";
import type { Topics } from "../pubsub.ts";

/** The inspector's feed: one item per announcement on the tenant's topics, each carrying ids. */
export type Payload<T extends keyof Topics> = Topics[T][1];
export type FeedPayload = { key: string; at: Date } & (
  | { kind: "SUMMARY_REVISION"; ref: Payload<"summaryChanged"> }
  | { kind: "TURN"; ref: Payload<"turnRecorded"> }
  | { kind: "EVENT"; ref: Payload<"eventAppended"> }
  | { kind: "ENTRY"; ref: Payload<"entryChanged"> }
  | { kind: "JOB_RUN"; ref: Payload<"jobRunChanged"> }
  | { kind: "FACT"; ref: Payload<"factChanged"> }
  | { kind: "RECALL"; ref: Payload<"memoryRecall"> }
);

export type FeedFilter = { agentId?: string; endUserId?: string; conversationId?: string };

/** The scopeRefs (events and entries) and users (facts and recalls) a filter reaches. */
export async function feedScope(db: TenantDb, wanted: FeedFilter) {
  const scopeRefs = new Set<string>();
  const endUserIds = new Set<string>(wanted.endUserId ? [wanted.endUserId] : []);
  if (wanted.conversationId) {
    const conversation = await db.conversation.findUnique({
      where: { id: wanted.conversationId },
      select: { endUserId: true, agent: { select: { externalId: true } }, endUser: { select: { externalId: true } } },
    });
    if (!conversation) throw notFound("Conversation", wanted.conversationId);
    scopeRefs.add(conversation.agent.externalId).add(conversation.endUser.externalId);
    endUserIds.add(conversation.endUserId);
  }
  if (wanted.agentId) {
    const agent = await db.agent.findUnique({ where: { id: wanted.agentId }, select: { externalId: true } });
    if (!agent) throw notFound("Agent", wanted.agentId);
    scopeRefs.add(agent.externalId);
  }
  if (wanted.endUserId) {
    const user = await db.endUser.findUnique({ where: { id: wanted.endUserId }, select: { externalId: true } });
    if (!user) throw notFound("End user", wanted.endUserId);
    scopeRefs.add(user.externalId);
  }
  return { scopeRefs, endUserIds };
}

/**
 * What a filtered feed lets through: items of the conversations that match, and events and
 * entries whose scopeRef is the agent's or the user's own id (as context assembly reads them).
 * Job runs are tenant-wide, so only an unfiltered feed shows them.
 */
export async function feedMatcher(db: TenantDb, wanted: FeedFilter) {
  if (!wanted.agentId && !wanted.endUserId && !wanted.conversationId) return async () => true;
  const { scopeRefs, endUserIds } = await feedScope(db, wanted);

  const owners = new Map<string, Promise<{ agentId: string; endUserId: string } | null>>();
  const conversationMatches = async (conversationId: string) => {
    if (wanted.conversationId && conversationId !== wanted.conversationId) return false;
    if (!owners.has(conversationId)) {
      owners.set(
        conversationId,
        db.conversation.findUnique({ where: { id: conversationId }, select: { agentId: true, endUserId: true } }),
      );
    }
    const owner = await owners.get(conversationId)!;
    return Boolean(
      owner &&
        (!wanted.agentId || owner.agentId === wanted.agentId) &&
        (!wanted.endUserId || owner.endUserId === wanted.endUserId),
    );
  };

  return async (item: FeedPayload): Promise<boolean> => {
    switch (item.kind) {
      case "SUMMARY_REVISION":
      case "TURN":
        return conversationMatches(item.ref.conversationId);
      case "EVENT":
      case "ENTRY":
        return scopeRefs.has(item.ref.scopeRef);
      case "FACT":
      case "RECALL":
        // Facts and recalls belong to a user: a filtered user's (or conversation's user's), and
        // those that came out of a matching conversation.
        return (
          (endUserIds.has(item.ref.endUserId) && !wanted.agentId) ||
          (item.ref.conversationId !== null && (await conversationMatches(item.ref.conversationId)))
        );
      case "JOB_RUN":
        return false;
    }
  };
}

