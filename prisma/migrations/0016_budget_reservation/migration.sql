-- Tokens held against a tenant's monthly budget by model calls in flight, so that concurrent
-- calls (in this process or another) cannot all pass the budget check before any has spent.
-- CreateTable
CREATE TABLE "BudgetReservation" (
    "id" TEXT NOT NULL,
    "tenantId" TEXT NOT NULL,
    "tokens" INTEGER NOT NULL,
    "expiresAt" TIMESTAMP(3) NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "BudgetReservation_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE INDEX "BudgetReservation_tenantId_expiresAt_idx" ON "BudgetReservation"("tenantId", "expiresAt");
