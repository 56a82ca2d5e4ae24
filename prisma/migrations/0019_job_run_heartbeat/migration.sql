-- A running job run writes a sign of life every minute (src/work/job-runs.ts): a run left RUNNING
-- by a process that stopped, on PostgreSQL where other instances may be running theirs, is marked
-- FAILED once it has none for 5 minutes, instead of saying RUNNING for ever. Runs recorded before
-- this migration have none: their start stands for it.
ALTER TABLE "JobRun" ADD COLUMN "heartbeatAt" TIMESTAMP(3);

-- The minute's sweep looks only at running runs: a partial index keeps that a lookup however many
-- finished runs a tenant has.
CREATE INDEX "JobRun_running_idx" ON "JobRun"("tenantId") WHERE "status" = 'RUNNING';
