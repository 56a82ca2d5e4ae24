import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import type { Conversation, Prisma, Turn } from "../generated/prisma/client.ts";
import { agentSettings } from "../memory/conversations/agents.ts";
import { followUpsJob, turnJob } from "../queue.ts";

/** A burst of turns within this window costs one queue write: their follow-ups run as one batch. */
export const FOLLOW_UPS_WINDOW_MS = 200;

/** Turns whose follow-ups make no model call (summary and extraction off) are drained in batches. */
export function batchedFollowUps(settings: Prisma.JsonValue | undefined): boolean {
  if (settings === undefined) return false;
  const { summaryOn, extractionOn } = agentSettings({ settings });
  return !summaryOn && !extractionOn;
}

/**
 * What every new turn starts, whoever wrote it (recordTurn, importConversation, `engram
 * import`): a queue write for the turn's follow-ups, and the live announcement. The turn row is
 * the outbox: its `followUpsQueuedAt` stays null until its follow-ups are queued or done, so a
 * crash before this enqueue is caught up by the dispatcher (work/dispatch.ts), never lost. A turn
 * that needs no model joins the batch of its tenant (one queue write per window, see
 * runTurnFollowUps); any other gets its own turn job.
 */
export async function afterTurnRecorded(
  db: TenantDb,
  deps: Pick<Deps, "queue" | "pubsub" | "log">,
  recorded: {
    turn: Turn;
    conversation: Pick<Conversation, "id" | "agentId">;
    created: boolean;
    agentSettings?: Prisma.JsonValue;
  },
) {
  const { turn, conversation, created } = recorded;
  const tenantId = db.$tenantId();
  // A retry of a turn whose follow-ups were already queued has nothing to add.
  if (created || !turn.followUpsQueuedAt) {
    const queued =
      created && !turn.clientTurnId.startsWith("import:") && batchedFollowUps(recorded.agentSettings)
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
