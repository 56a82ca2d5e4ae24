-- AlterTable
ALTER TABLE "TenantSettings" ADD COLUMN     "forgetDeletesMessages" BOOLEAN NOT NULL DEFAULT true;

-- AlterTable
ALTER TABLE "Turn" ADD COLUMN     "followUpsQueuedAt" TIMESTAMP(3);

-- Turns recorded before the outbox had their follow-ups queued by the request itself.
UPDATE "Turn" SET "followUpsQueuedAt" = "createdAt";

-- Hand-written: the dispatcher reads only the turns still waiting (Prisma cannot express a partial index).
CREATE INDEX "Turn_pending_follow_ups_idx" ON "Turn"("createdAt") WHERE "followUpsQueuedAt" IS NULL;
