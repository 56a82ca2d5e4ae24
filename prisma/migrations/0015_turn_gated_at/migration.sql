-- A turn is marked once the gate has judged its user message and done what it asked to forget,
-- so that a retried or repeated job never judges it again (a forget deletes the stored verdicts,
-- and a second judgement could forget again what the user said since).
ALTER TABLE "Turn" ADD COLUMN "gatedAt" TIMESTAMP(3);

-- The gate's own lease on a conversation: one runner judges its turns at a time, across workers.
ALTER TABLE "Conversation" ADD COLUMN "gateLeaseUntil" TIMESTAMP(3);

-- Turns dispatched before this column were judged by their turn job, except those whose job is
-- still queued or running (the version before marked a turn dispatched before its gate ran): those
-- stay unjudged, and their job, or the gate job the dispatcher queues a minute on, judges them.
UPDATE "Turn" SET "gatedAt" = "followUpsQueuedAt" WHERE "followUpsQueuedAt" IS NOT NULL;
DO $$
BEGIN
  IF to_regclass('agenda_jobs') IS NOT NULL THEN
    UPDATE "Turn" t SET "gatedAt" = NULL
    FROM "agenda_jobs" j
    WHERE j."name" = 'memory.turn' AND (j."next_run_at" IS NOT NULL OR j."locked_at" IS NOT NULL)
      AND j."data"->>'turnId' = t."id";
  END IF;
END $$;

-- Hand-written: a conversation's turns still to judge, in order (Prisma cannot express a partial index).
CREATE INDEX "Turn_awaiting_gate_idx" ON "Turn"("conversationId", "firstSeq") WHERE "gatedAt" IS NULL;
