-- Each version of a fact keeps the message it was extracted from, so that deleting the fact also
-- forgets what its earlier versions were read from (src/memory/forget.ts, forgetFact). Versions
-- written before this migration knew no message; the newest version of each fact is the fact's
-- current text, whose message the fact itself names, and gets it.
ALTER TABLE "FactVersion" ADD COLUMN "sourceMessageId" TEXT;

UPDATE "FactVersion" v SET "sourceMessageId" = f."sourceMessageId"
FROM "Fact" f
WHERE f."id" = v."factId" AND f."sourceMessageId" IS NOT NULL AND v."text" = f."text"
  AND v."createdAt" = (SELECT max(w."createdAt") FROM "FactVersion" w WHERE w."factId" = f."id");
