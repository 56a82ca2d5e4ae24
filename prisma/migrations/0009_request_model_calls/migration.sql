-- AlterTable
ALTER TABLE "TenantSettings" ADD COLUMN     "modelCallsPerRequest" INTEGER;
