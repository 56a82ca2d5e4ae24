import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import type { Conversation, Turn } from "../generated/prisma/client.ts";
import { turnJob } from "../queue.ts";

/**
 * What every new turn starts, whoever wrote it (recordTurn, importConversation, `engram
 * import`): one queue write for the turn's follow-ups, and the live announcement. The turn row
 * is the outbox: its `followUpsQueuedAt` stays null until the turn job has queued the rest, so
 * a crash before this enqueue is caught up by the dispatcher (work/dispatch.ts), never lost.
 */
export async function afterTurnRecorded(
  db: TenantDb,
  deps: Pick<Deps, "queue" | "pubsub" | "log">,
  recorded: { turn: Turn; conversation: Pick<Conversation, "id" | "agentId">; created: boolean },
) {
  const { turn, conversation, created } = recorded;
  const tenantId = db.$tenantId();
  // A retry of a turn whose follow-ups were already queued has nothing to add.
  if (created || !turn.followUpsQueuedAt) {
    await deps.queue.enqueue(turnJob, { tenantId, turnId: turn.id }).catch((error) =>
      deps.log.warn("could not queue a turn's follow-ups; the dispatcher will", { turnId: turn.id, error }),
    );
  }
  if (created) {
    deps.pubsub.publish("turnRecorded", tenantId, {
      turnId: turn.id,
      agentId: conversation.agentId,
      conversationId: conversation.id,
    });
  }
}
