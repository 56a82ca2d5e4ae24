-- AlterTable
ALTER TABLE "Conversation" ADD COLUMN     "summaryLeaseUntil" TIMESTAMP(3);
