-- A turn is marked once the gate has judged its user message and done what it asked to forget,
-- so that a retried or repeated job never judges it again (a forget deletes the stored verdicts,
-- and a second judgement could forget again what the user said since).
ALTER TABLE "Turn" ADD COLUMN "gatedAt" TIMESTAMP(3);

-- Turns dispatched before this column were judged by their turn job. A job the version before
-- queued for a turn dispatched in its last seconds finds the mark and skips the gate; extraction
-- still reads the turn with its batch or on the quiet-period timer.
UPDATE "Turn" SET "gatedAt" = "followUpsQueuedAt" WHERE "followUpsQueuedAt" IS NOT NULL;

-- Hand-written: a conversation's turns still to judge, in order (Prisma cannot express a partial index).
CREATE INDEX "Turn_awaiting_gate_idx" ON "Turn"("conversationId", "firstSeq") WHERE "gatedAt" IS NULL;
