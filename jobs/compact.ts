import { z } from "zod";
import { createCompactorChain } from "../src/chains/compactor.ts";
import { forTenant } from "../src/db.ts";
import { compactTenant } from "../src/memory/compaction.ts";
import { recordJobRun } from "../src/memory/job-runs.ts";
import type { Services } from "../src/services.ts";
import { defineJob } from "./define.ts";

export const compactJob = defineJob({
  name: "memory.compact",
  // No tenant: every active tenant, as the daily schedule runs it.
  schema: z.object({ tenantId: z.string().optional() }).default({}),
});

export const COMPACTION_CRON = "17 6 * * *";

/** Daily compaction across tenants; each tenant's run is recorded and visible in jobRuns. */
export async function runCompaction(services: Services, payload: z.infer<typeof compactJob.schema>) {
  const { db, log, pubsub, models } = services;
  const tenants = await db.tenant.findMany({
    where: { active: true, ...(payload.tenantId ? { id: payload.tenantId } : {}) },
    include: { settings: true },
  });
  const runs = [];
  for (const tenant of tenants) {
    const tenantDb = forTenant(db, tenant.id);
    const model = await models.chat(tenant.id, "compaction", "compact");
    runs.push(
      await recordJobRun(tenantDb, pubsub, compactJob.name, async () => {
        if (!model) {
          log.info("compaction is off: no model configured (set OPENAI_API_KEY or OPENAI_BASE_URL)", {
            tenantId: tenant.id,
          });
          return { status: "SKIPPED", result: { reason: "compaction is off: no model configured" } };
        }
        const result = await compactTenant(
          tenantDb,
          { compactor: createCompactorChain(model), pubsub, log },
          {
            minEvents: tenant.settings?.compactionMinEvents ?? 3,
            olderThanDays: tenant.settings?.compactionAgeDays ?? 90,
          },
        );
        log.info("compaction finished", { tenantId: tenant.id, ...result });
        return { status: result.failed > 0 ? "FAILED" : "SUCCEEDED", result };
      }),
    );
  }
  return runs;
}
