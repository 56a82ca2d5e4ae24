import { z } from "zod";
import { forTenant } from "../src/db.ts";
import { recordJobRun } from "../src/work/job-runs.ts";
import { applyRetention, DEFAULT_RETENTION_DAYS } from "../src/work/retention.ts";
import type { Services } from "../src/services.ts";
import { defineJob } from "./define.ts";

export const retentionJob = defineJob({
  name: "memory.retention",
  // No tenant: every active tenant, as the nightly schedule runs it.
  schema: z.object({ tenantId: z.string().optional() }).default({}),
});

export const RETENTION_CRON = "0 3 * * *";

/** Nightly retention across tenants, each tenant's run recorded and visible in jobRuns. */
export async function runRetention(services: Services, payload: z.infer<typeof retentionJob.schema>, now = new Date()) {
  const { db, log, pubsub } = services;
  const tenants = await db.tenant.findMany({
    where: { active: true, ...(payload.tenantId ? { id: payload.tenantId } : {}) },
    include: { settings: true },
  });
  const runs = [];
  for (const tenant of tenants) {
    // One tenant's failure (recorded as its FAILED run) never stops the others' retention.
    const run = await recordJobRun(forTenant(db, tenant.id), pubsub, retentionJob.name, async () => {
      const result = await applyRetention(services, tenant.id, {
        retentionDays: tenant.settings?.retentionDays ?? DEFAULT_RETENTION_DAYS,
        now,
      });
      log.info("retention finished", { tenantId: tenant.id, ...result });
      return { status: "SUCCEEDED" as const, result };
    }).catch((error) => {
      log.error("retention of a tenant failed; the others go on", { tenantId: tenant.id, error });
      return null;
    });
    if (run) runs.push(run);
  }
  return runs;
}
