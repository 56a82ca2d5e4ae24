-- The reconcile sweep's two questions, every minute: which snippets wait for a vector
-- ("indexedAt" IS NULL) and which were indexed in the last few minutes (checked against Chroma).
CREATE INDEX "RecallSnippet_tenantId_indexedAt_idx" ON "RecallSnippet"("tenantId", "indexedAt");
