-- Each snippet keeps its messages' seqs, so that recall finds a turn's neighbours without a
-- lookup per message on every search (bench/README.md, "Recall latency: goal and what remains").
-- A seq never changes once written; snippets made before this are filled in from their messages
-- (0 for a message deleted since, as recall reported it before).
ALTER TABLE "RecallSnippet" ADD COLUMN     "messageSeqs" INTEGER[] DEFAULT ARRAY[]::INTEGER[];

UPDATE "RecallSnippet" s
SET "messageSeqs" = (
  SELECT array_agg(coalesce(m."seq", 0) ORDER BY u.ord)
  FROM unnest(s."messageIds") WITH ORDINALITY AS u(id, ord)
  LEFT JOIN "Message" m ON m."id" = u.id AND m."tenantId" = s."tenantId"
)
WHERE cardinality(s."messageIds") > 0;
