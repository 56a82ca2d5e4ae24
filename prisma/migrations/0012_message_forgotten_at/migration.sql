-- A message forgotten while the tenant keeps raw messages (forgetDeletesMessages off) is marked,
-- so that no recall snippet is made from it again.
ALTER TABLE "Message" ADD COLUMN "forgottenAt" TIMESTAMP(3);
