import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import type { Conversation, Turn } from "../generated/prisma/client.ts";
import { followUpsJob, turnJob } from "../queue.ts";

/** A burst of turns within this window costs one queue write: their follow-ups run as one batch. */
export const FOLLOW_UPS_WINDOW_MS = 200;

/**
 * What every new turn starts, whoever wrote it (recordTurn, importConversation, `engram
 * import`): a queue write for the turn's follow-ups, and the live announcement. The turn row is
 * the outbox: its `followUpsQueuedAt` stays null until its follow-ups are queued or done, so a
 * crash before this enqueue is caught up by the dispatcher (work/dispatch.ts), never lost. A new
 * turn joins the batch of its tenant: one queue write per window, whatever the agent's settings
 * (runTurnFollowUps, which hands the turns whose gate and extraction call a model to their own
 * turn job). An imported turn, and a retried one whose write never happened, gets its turn job.
 */
export async function afterTurnRecorded(
  db: TenantDb,
  deps: Pick<Deps, "queue" | "pubsub" | "log">,
  recorded: {
    turn: Turn;
    conversation: Pick<Conversation, "id" | "agentId">;
    created: boolean;
  },
) {
  const { turn, conversation, created } = recorded;
  const tenantId = db.$tenantId();
  // A retry of a turn whose follow-ups were already queued has nothing to add.
  if (created || !turn.followUpsQueuedAt) {
    const queued =
      created && !turn.clientTurnId.startsWith("import:")
        ? deps.queue.enqueueSoon(followUpsJob, { tenantId }, "tenantId", FOLLOW_UPS_WINDOW_MS)
        : deps.queue.enqueue(turnJob, { tenantId, turnId: turn.id });
    await queued.catch((error) =>
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
