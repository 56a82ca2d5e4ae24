import { sqlTimestamp } from "../db.ts";
import type { Deps } from "../deps.ts";
import { conversationTurnsJob, turnJob } from "../queue.ts";
import { forEachTenant } from "./tenants.ts";

// A turn younger than this most likely has its job queued and waiting.
const GRACE_MS = 30_000;
// A turn out of the outbox this long and still unjudged most likely lost its conversation's gate
// job (a dead-lettered run, a request that landed on its row between the lock and the run's start).
const JUDGE_GRACE_MS = 60_000;
const MAX_PER_TENANT = 1_000;

/**
 * The outbox's dispatcher: turns committed without their follow-ups queued (the process died
 * between the commit and the enqueue, or the queue was down) get their turn job now. Coalesced
 * per turn, so a job that is merely waiting is not doubled. And the conversations of turns out of
 * the outbox but still unjudged a minute on get their gate job, coalesced per conversation.
 */
export async function dispatchPendingTurns(deps: Pick<Deps, "tenants" | "queue" | "log">, options: { graceMs?: number } = {}) {
  const olderThan = new Date(Date.now() - (options.graceMs ?? GRACE_MS));
  const judgedBy = new Date(Date.now() - JUDGE_GRACE_MS);
  const dispatched: Record<string, number> = {};
  // One tenant's failure never stops the others' catch-up.
  await forEachTenant(deps, "outbox catch-up", async (tenant, db) => {
    const unjudged = await db.$queryRaw<{ conversationId: string }[]>`
      SELECT DISTINCT "conversationId" FROM "Turn"
      WHERE "tenantId" = ${tenant.id} AND "gatedAt" IS NULL AND "followUpsQueuedAt" < ${sqlTimestamp(judgedBy)} AND "clientTurnId" NOT LIKE 'import:%'
      LIMIT ${MAX_PER_TENANT}`;
    // A job of its own each (not coalesced: Agenda's debounce would reschedule every finished gate
    // job row of the conversation); at most one a minute. One already waiting (retrying through
    // a model outage, say, up to 5 minutes apart) is made due now instead: no second job, and
    // the turns are judged within a minute of the model's return.
    const waiting = await deps.queue.hurry(conversationTurnsJob, "conversationId", unjudged.map((u) => u.conversationId));
    const gateless = unjudged.filter((u) => !waiting.has(u.conversationId));
    for (const { conversationId } of gateless) await deps.queue.enqueue(conversationTurnsJob, { tenantId: tenant.id, conversationId });
    if (gateless.length) deps.log.info("gate: queued the gate job of conversations with turns still unjudged", { tenantId: tenant.id, conversations: gateless.length });
    const pending = await db.turn.findMany({
      where: { followUpsQueuedAt: null, createdAt: { lt: olderThan } },
      orderBy: { createdAt: "asc" },
      select: { id: true },
      take: MAX_PER_TENANT,
    });
    for (const turn of pending) {
      await deps.queue.enqueueCoalesced(turnJob, { tenantId: tenant.id, turnId: turn.id }, "turnId", 1_000);
    }
    if (pending.length) dispatched[tenant.id] = pending.length;
  });
  if (Object.keys(dispatched).length) deps.log.info("outbox: queued follow-ups of turns that had none", { dispatched });
  return dispatched;
}
