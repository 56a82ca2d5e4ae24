-- AlterEnum
ALTER TYPE "SnippetKind" ADD VALUE 'FACT';

-- AlterTable
ALTER TABLE "Fact" ADD COLUMN     "subject" TEXT;

-- AlterTable
ALTER TABLE "RecallSnippet" ADD COLUMN     "factId" TEXT,
ADD COLUMN     "keyOfId" TEXT;

-- CreateIndex
CREATE INDEX "RecallSnippet_keyOfId_idx" ON "RecallSnippet"("keyOfId");

-- CreateIndex
CREATE INDEX "RecallSnippet_factId_idx" ON "RecallSnippet"("factId");

-- AddForeignKey
ALTER TABLE "RecallSnippet" ADD CONSTRAINT "RecallSnippet_factId_fkey" FOREIGN KEY ("factId") REFERENCES "Fact"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "RecallSnippet" ADD CONSTRAINT "RecallSnippet_keyOfId_fkey" FOREIGN KEY ("keyOfId") REFERENCES "RecallSnippet"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- Recall's keyword side also matches a snippet's date: its indexed words start with a header
-- such as "2023-05-08, Monday, May 2023", so "in May" or "on Monday" find it by words too.
-- (Hand-written: Prisma models the tsvector column as Unsupported. to_char is only STABLE
-- because of TM-localised names; without TM its English names and digits never change, and a
-- timestamp without time zone has no session time zone to depend on.)
CREATE FUNCTION "engram_date_words"(t timestamp(3)) RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT to_char(t, 'YYYY-MM-DD, FMDay, FMMonth YYYY') $$;

DROP INDEX "RecallSnippet_search_idx";
ALTER TABLE "RecallSnippet" DROP COLUMN "search";
ALTER TABLE "RecallSnippet" ADD COLUMN "search" tsvector
  GENERATED ALWAYS AS (to_tsvector('english', "engram_date_words"("occurredAt") || E'\n' || "text")) STORED;
CREATE INDEX "RecallSnippet_search_idx" ON "RecallSnippet" USING GIN ("search");
