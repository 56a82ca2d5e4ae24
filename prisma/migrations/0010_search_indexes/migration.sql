-- searchMemory's full-text columns for facts and events, as entries and snippets have theirs
-- (hand-written: Prisma models these columns as Unsupported("tsvector")). Stored, so a scan
-- never re-parses the text, and GIN-indexed.
ALTER TABLE "Fact" ADD COLUMN "search" tsvector
    GENERATED ALWAYS AS (to_tsvector('english', "text")) STORED;
CREATE INDEX "Fact_search_idx" ON "Fact" USING GIN ("search");

ALTER TABLE "MemoryEvent" ADD COLUMN "search" tsvector
    GENERATED ALWAYS AS (to_tsvector('english', "kind" || ' ' || "body")) STORED;
CREATE INDEX "MemoryEvent_search_idx" ON "MemoryEvent" USING GIN ("search");
