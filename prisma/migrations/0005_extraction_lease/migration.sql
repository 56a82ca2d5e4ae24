-- AlterTable
ALTER TABLE "Conversation" ADD COLUMN     "extractionLeaseUntil" TIMESTAMP(3);
