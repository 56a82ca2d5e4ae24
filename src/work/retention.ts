import type { Deps } from "../deps.ts";
import { forgetExpired, pruneFinishedJobs } from "../memory/forget.ts";
import { retentionJob } from "../queue.ts";
import type { z } from "zod";
import { recordJobRun } from "./job-runs.ts";
import { forEachTenant } from "./tenants.ts";

export const DEFAULT_RETENTION_DAYS = 180;
const DAY_MS = 86_400_000;
/** How long the queue keeps a finished job's record (for an operator looking at the queue's table). */
export const FINISHED_JOBS_KEPT_MS = DAY_MS;

export type RetentionResult = { retentionDays: number; cutoff: string | null; snippetsDeleted: number; factsDeleted: number; verdictsDeleted: number };

type RetentionDeps = Pick<Deps, "tenants" | "pubsub" | "vectors" | "embeddings" | "log" | "queue">;

/**
 * One tenant's retention window, through the forgetting path: recall snippets (rows and
 * vectors) of moments older than the window, facts not confirmed within it, and the gate's
 * verdicts stored before it. 0 days keeps everything until forgotten.
 */
export async function applyRetention(
  deps: RetentionDeps,
  tenantId: string,
  options: { retentionDays: number; now?: Date },
): Promise<RetentionResult> {
  const { retentionDays } = options;
  if (retentionDays <= 0) return { retentionDays, cutoff: null, snippetsDeleted: 0, factsDeleted: 0, verdictsDeleted: 0 };
  const cutoff = new Date((options.now ?? new Date()).getTime() - retentionDays * DAY_MS);
  const { facts, snippets, verdicts } = await forgetExpired(
    deps.tenants.scoped(tenantId),
    deps,
    cutoff,
    `not confirmed within the retention window of ${retentionDays} days`,
  );
  return { retentionDays, cutoff: cutoff.toISOString(), snippetsDeleted: snippets, factsDeleted: facts, verdictsDeleted: verdicts };
}

/** How soon a tenant's failed run is tried again (then on the job's backoff), rather than the next night. */
export const RETENTION_RETRY_MS = 60_000;

/**
 * Nightly retention across tenants, each tenant's run recorded (a failure as its FAILED run) and
 * visible in jobRuns. A tenant whose run failed (the store away, a full disk, Chroma down) gets a
 * run of its own a minute later, retried with the backoff until it works; such a run throws on
 * failure for that.
 */
export async function retentionSweep(deps: RetentionDeps, payload: z.infer<typeof retentionJob.schema>, now = new Date()) {
  const sweep = await forEachTenant(
    deps,
    "retention",
    (tenant, db) =>
      recordJobRun(db, deps.pubsub, "memory.retention", async () => {
        const settings = await db.tenantSettings.findUnique({ where: { tenantId: tenant.id } });
        const result = await applyRetention(deps, tenant.id, {
          retentionDays: settings?.retentionDays ?? DEFAULT_RETENTION_DAYS,
          now,
        });
        // Whatever the window, 0 days included: these are the queue's records, not the tenant's memory.
        const finishedJobsDeleted = await pruneFinishedJobs(db, new Date(now.getTime() - FINISHED_JOBS_KEPT_MS));
        deps.log.info("retention finished", { tenantId: tenant.id, ...result, finishedJobsDeleted });
        return { status: "SUCCEEDED" as const, result: { ...result, finishedJobsDeleted } };
      }),
    payload.tenantId,
  );
  if (payload.tenantId && sweep.failed.length) throw new Error("retention of the tenant failed; it is tried again");
  // One retry job a tenant: a tenant failing night after night has the one still waiting.
  const failed = sweep.failed.map((failure) => failure.tenantId);
  const waiting = await deps.queue.waiting(retentionJob, "tenantId", failed);
  for (const tenantId of failed) if (!waiting.has(tenantId)) await deps.queue.enqueue(retentionJob, { tenantId }, { delayMs: RETENTION_RETRY_MS });
  return sweep;
}
