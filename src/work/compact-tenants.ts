import { CronExpressionParser } from "cron-parser";
import type { z } from "zod";
import { chainFor } from "../chains/registry.ts";
import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { budgetExhausted } from "../governance/budget.ts";
import { loadTenantSettings } from "../governance/settings.ts";
import { compactTenant } from "../memory/log/compaction.ts";
import { compactJob } from "../queue.ts";
import { failRunsOfTheDead, recordJobRun } from "./job-runs.ts";
import { forEachTenant } from "./tenants.ts";

/** Each tenant has its own schedule (default 06:17 UTC); a sweep every minute starts the runs that are due. */
export const COMPACTION_SWEEP_CRON = "* * * * *";

type CompactDeps = Pick<Deps, "tenants" | "models" | "queue" | "pubsub" | "log">;

// After a failed run (a model outage, a process that stopped mid-run: failRunsOfTheDead), the
// same occurrence's compaction is tried again: 15 minutes after it ended, then 30, 60 and 120
// minutes after the next failures; then it waits for the schedule's next occurrence.
const RETRY_FIRST_MS = 15 * 60_000;
const RETRIES = 4;

/**
 * Whether the tenant's schedule had an occurrence since its last compaction run (or its
 * creation), or that occurrence's runs all failed and the next retry is due.
 */
async function compactionDue(db: TenantDb, schedule: string, since: Date, now: Date): Promise<boolean> {
  const previous = CronExpressionParser.parse(schedule, { currentDate: now, tz: "UTC" }).prev().toDate();
  const recent = await db.jobRun.findMany({
    where: { name: compactJob.name, startedAt: { gt: since } },
    orderBy: { startedAt: "desc" },
    take: RETRIES + 1,
    select: { status: true, startedAt: true, finishedAt: true },
  });
  const last = recent[0];
  if (!last || previous > last.startedAt) return previous > (last?.startedAt ?? since);
  const failed = recent.findIndex((run) => run.status !== "FAILED" || run.startedAt < previous);
  const failures = failed === -1 ? recent.length : failed;
  if (failures === 0 || failures > RETRIES) return false;
  return now.getTime() - (last.finishedAt ?? last.startedAt).getTime() >= RETRY_FIRST_MS * 2 ** (failures - 1);
}

/** Daily compaction across tenants; each tenant's run is recorded (a failure as its FAILED run) and visible in jobRuns. */
export function compactTenants(deps: CompactDeps, payload: z.infer<typeof compactJob.schema>, now = new Date()) {
  const { log, pubsub, models } = deps;
  return forEachTenant(
    deps,
    "compaction",
    async (tenant, tenantDb) => {
      // Read per run: a settings change applies from the next run without a restart.
      const settings = await loadTenantSettings(tenantDb);
      // The minute's sweep also closes the tenant's runs (of any job) whose process stopped, so a
      // compaction run so ended is retried like any failed one.
      if (payload.due) await failRunsOfTheDead(tenantDb, pubsub, now);
      if (payload.due && !(await compactionDue(tenantDb, settings.compaction.schedule, tenant.createdAt, now))) return undefined;
      return recordJobRun(tenantDb, pubsub, compactJob.name, async () => {
        const compactor = await chainFor(models, tenant.id, "compactor");
        if (!compactor) {
          log.info("compaction is off: no model configured (set OPENAI_API_KEY or OPENAI_BASE_URL)", {
            tenantId: tenant.id,
          });
          return { status: "SKIPPED", result: { reason: "compaction is off: no model configured" } };
        }
        const before = await models.budget(tenant.id);
        if (before.paused) {
          return { status: "SKIPPED", result: { paused: true, reason: budgetExhausted(before).message } };
        }
        const result = await compactTenant(
          tenantDb,
          { compactor, pubsub, log },
          { minEvents: settings.compaction.minEvents, olderThanDays: settings.compaction.olderThanDays },
        );
        log.info("compaction finished", { tenantId: tenant.id, ...result });
        // Buckets that failed because the budget ran out mid-run stay uncompressed for the retry.
        const paused = result.failed > 0 && (await models.budget(tenant.id)).paused;
        return { status: result.failed > 0 ? "FAILED" : "SUCCEEDED", result: paused ? { ...result, paused } : result };
      });
    },
    payload.tenantId,
  );
}

/**
 * What the worker runs: a tenant paused by its budget is retried on its own, with the queue's
 * backoff, until the period rolls over or the budget is raised; nothing it had is marked meanwhile.
 */
export async function compactTenantsUntilDone(deps: CompactDeps, payload: z.infer<typeof compactJob.schema>) {
  const { done } = await compactTenants(deps, payload);
  const paused = done.filter((run) => (run.result as { paused?: boolean } | null)?.paused);
  if (paused.length === 0) return;
  if (payload.tenantId) throw budgetExhausted(await deps.models.budget(payload.tenantId));
  for (const run of paused) {
    await deps.queue.enqueueCoalesced(compactJob, { tenantId: run.tenantId }, "tenantId", 1_000);
  }
}
