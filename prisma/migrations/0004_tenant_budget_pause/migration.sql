-- AlterTable
ALTER TABLE "TenantSettings" ADD COLUMN     "budgetPausedSince" TIMESTAMP(3);
