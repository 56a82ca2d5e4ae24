import { CronExpressionParser } from "cron-parser";
import { z } from "zod";
import { createCompactorChain } from "../src/chains/compactor.ts";
import { forTenant, type TenantDb } from "../src/db.ts";
import { budgetExhausted } from "../src/governance/budget.ts";
import { compactTenant } from "../src/memory/log/compaction.ts";
import { recordJobRun } from "../src/work/job-runs.ts";
import { loadTenantSettings } from "../src/governance/settings.ts";
import type { Services } from "../src/services.ts";
import { defineJob } from "./define.ts";

export const compactJob = defineJob({
  name: "memory.compact",
  // No tenant: every active tenant, as the daily schedule runs it.
  // due: only tenants whose own compaction schedule has come round since their last run.
  schema: z.object({ tenantId: z.string().optional(), due: z.boolean().optional() }).default({}),
});

/** Each tenant has its own schedule (default 06:17 UTC); this sweep starts the runs that are due. */
export const COMPACTION_CRON = "* * * * *";

/** Whether the tenant's schedule had an occurrence since its last compaction run (or its creation). */
async function compactionDue(db: TenantDb, schedule: string, since: Date, now: Date): Promise<boolean> {
  const previous = CronExpressionParser.parse(schedule, { currentDate: now, tz: "UTC" }).prev().toDate();
  const last = await db.jobRun.findFirst({ where: { name: compactJob.name }, orderBy: { startedAt: "desc" } });
  return previous > (last && last.startedAt > since ? last.startedAt : since);
}

/** Daily compaction across tenants; each tenant's run is recorded and visible in jobRuns. */
export async function runCompaction(services: Services, payload: z.infer<typeof compactJob.schema>, now = new Date()) {
  const { db, log, pubsub, models } = services;
  const tenants = await db.tenant.findMany({
    where: { active: true, ...(payload.tenantId ? { id: payload.tenantId } : {}) },
  });
  const runs = [];
  for (const tenant of tenants) {
    const tenantDb = forTenant(db, tenant.id);
    // Read per run: a settings change applies from the next run without a restart.
    const settings = await loadTenantSettings(tenantDb);
    if (payload.due && !(await compactionDue(tenantDb, settings.compaction.schedule, tenant.createdAt, now))) continue;
    // One tenant's failure (recorded as its FAILED run) never stops the others' compaction.
    const run = await recordJobRun(tenantDb, pubsub, compactJob.name, async () => {
        const model = await models.chat(tenant.id, "compaction", "compact");
        if (!model) {
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
          { compactor: createCompactorChain(model), pubsub, log },
          { minEvents: settings.compaction.minEvents, olderThanDays: settings.compaction.olderThanDays },
        );
        log.info("compaction finished", { tenantId: tenant.id, ...result });
        // Buckets that failed because the budget ran out mid-run stay uncompressed for the retry.
        const paused = result.failed > 0 && (await models.budget(tenant.id)).paused;
        return { status: result.failed > 0 ? "FAILED" : "SUCCEEDED", result: paused ? { ...result, paused } : result };
    }).catch((error) => {
      log.error("compaction of a tenant failed; the others go on", { tenantId: tenant.id, error });
      return null;
    });
    if (run) runs.push(run);
  }
  return runs;
}

/**
 * What the worker runs: a tenant paused by its budget is retried on its own, with the queue's
 * backoff, until the period rolls over or the budget is raised; nothing it had is marked meanwhile.
 */
export async function compactionJobRun(services: Services, payload: z.infer<typeof compactJob.schema>) {
  const runs = await runCompaction(services, payload);
  const paused = runs.filter((run) => (run.result as { paused?: boolean } | null)?.paused);
  if (paused.length === 0) return;
  if (payload.tenantId) throw budgetExhausted(await services.models.budget(payload.tenantId));
  for (const run of paused) {
    await services.jobs.enqueueCoalesced(compactJob, { tenantId: run.tenantId }, "tenantId", 1_000);
  }
}
