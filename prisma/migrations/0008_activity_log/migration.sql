-- CreateTable
CREATE TABLE "ActivityLog" (
    "id" TEXT NOT NULL,
    "tenantId" TEXT NOT NULL,
    "kind" TEXT NOT NULL,
    "refId" TEXT,
    "change" TEXT,
    "agentId" TEXT,
    "endUserId" TEXT,
    "conversationId" TEXT,
    "scope" TEXT,
    "scopeRef" TEXT,
    "detail" JSONB,
    "at" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "ActivityLog_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE INDEX "ActivityLog_tenantId_at_idx" ON "ActivityLog"("tenantId", "at");

-- CreateIndex
CREATE INDEX "ActivityLog_tenantId_endUserId_idx" ON "ActivityLog"("tenantId", "endUserId");

-- CreateIndex
CREATE INDEX "ActivityLog_tenantId_conversationId_idx" ON "ActivityLog"("tenantId", "conversationId");
