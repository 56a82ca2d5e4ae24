-- A message one of whose facts a person deleted (deleteFact) is marked, so that an extraction
-- that read it before the delete does not write the fact again from it.
ALTER TABLE "Message" ADD COLUMN "factsForgottenAt" TIMESTAMP(3);
