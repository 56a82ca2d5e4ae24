-- The reconcile sweep's lost-vector check, every minute: the snippets indexed since its last run
-- (a range on "indexedAt"), to ask Chroma whether it still has their vectors.
CREATE INDEX "RecallSnippet_tenantId_indexedAt_idx" ON "RecallSnippet"("tenantId", "indexedAt");
