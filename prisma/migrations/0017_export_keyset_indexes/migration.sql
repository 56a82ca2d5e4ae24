-- The export pages each list of a person's history by (time, id) (src/memory/export.ts): with an
-- index on the list's filter followed by (time, id), each page starts where the one before ended
-- instead of scanning all of the person's rows again. Each index replaces the one on its leading
-- columns, which it serves as well.
-- DropIndex
DROP INDEX "Conversation_tenantId_endUserId_idx";

-- DropIndex
DROP INDEX "SummaryRevision_conversationId_createdAt_idx";

-- DropIndex
DROP INDEX "RecallSnippet_tenantId_endUserId_idx";

-- DropIndex
DROP INDEX "MemoryEvent_tenantId_scope_scopeRef_occurredAt_idx";

-- DropIndex
DROP INDEX "MemoryEntry_tenantId_scope_scopeRef_idx";

-- CreateIndex
CREATE INDEX "Conversation_tenantId_endUserId_createdAt_id_idx" ON "Conversation"("tenantId", "endUserId", "createdAt", "id");

-- CreateIndex
CREATE INDEX "SummaryRevision_conversationId_createdAt_id_idx" ON "SummaryRevision"("conversationId", "createdAt", "id");

-- CreateIndex
CREATE INDEX "RecallSnippet_tenantId_endUserId_occurredAt_id_idx" ON "RecallSnippet"("tenantId", "endUserId", "occurredAt", "id");

-- CreateIndex
CREATE INDEX "MemoryEvent_tenantId_scope_scopeRef_occurredAt_id_idx" ON "MemoryEvent"("tenantId", "scope", "scopeRef", "occurredAt", "id");

-- CreateIndex
CREATE INDEX "MemoryEntry_tenantId_scope_scopeRef_createdAt_id_idx" ON "MemoryEntry"("tenantId", "scope", "scopeRef", "createdAt", "id");
