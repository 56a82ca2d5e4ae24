-- AlterTable
ALTER TABLE "Fact" ADD COLUMN     "contradictsId" TEXT;

-- CreateTable
CREATE TABLE "GateVerdict" (
    "id" TEXT NOT NULL,
    "tenantId" TEXT NOT NULL,
    "conversationId" TEXT NOT NULL,
    "messageHash" TEXT NOT NULL,
    "remember" BOOLEAN NOT NULL,
    "forget" TEXT NOT NULL,
    "forgetTargets" TEXT[],
    "needsRecall" BOOLEAN NOT NULL,
    "decidedBy" TEXT NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "GateVerdict_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE INDEX "GateVerdict_tenantId_createdAt_idx" ON "GateVerdict"("tenantId", "createdAt");

-- CreateIndex
CREATE UNIQUE INDEX "GateVerdict_conversationId_messageHash_key" ON "GateVerdict"("conversationId", "messageHash");
