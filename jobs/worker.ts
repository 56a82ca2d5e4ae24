import { backoffStrategies } from "agenda";
import type { Services } from "../src/services.ts";
import { compactJob, COMPACTION_CRON, compactionJobRun } from "./compact.ts";
import { runSummarize, SUMMARIZE_DEBOUNCE_MS, summarizeJob } from "./summarize.ts";
import { indexSnippetsJob, runIndexSnippets } from "./index-snippets.ts";
import { reconcileJob, RECONCILE_EVERY, runReconcile } from "./reconcile.ts";
import { retentionJob, RETENTION_CRON, runRetention } from "./retention.ts";
import { extractJob, runExtractAll, runTurnWork, turnJob } from "./turn.ts";

export type Worker = { stop(graceMs?: number): Promise<void> };

// Model outages and crashes delay work, never lose it: retry with growing delays, without end.
const untilItWorks = backoffStrategies.exponential({ delay: 1_000, maxDelay: 300_000, maxRetries: 1_000_000 });
// Indexing retries for a couple of minutes; after that the reconcile job picks the snippets up.
const untilReconciled = backoffStrategies.exponential({ delay: 1_000, maxDelay: 60_000, maxRetries: 7 });

/** Registers every job on the shared queue, schedules the daily ones and starts processing. */
export async function startWorker(services: Services): Promise<Worker> {
  const { jobs, log } = services;
  const { agenda } = jobs;
  agenda.on("error", (error) => log.error("job queue error", { error }));
  agenda.on("fail", (error, job) => log.warn("job failed; it will be retried", { job: job.attrs.name, error }));

  agenda.define(
    compactJob.name,
    async (job) => {
      await compactionJobRun(services, compactJob.schema.parse(job.attrs.data ?? {}));
    },
    // A tenant's run paused by its budget fails and is retried until the budget allows it.
    { backoff: untilItWorks },
  );
  agenda.define(
    summarizeJob.name,
    async (job) => {
      const outcome = await runSummarize(services, summarizeJob.schema.parse(job.attrs.data));
      // The coalesced job is one row per conversation; a request made while it ran was written to
      // this very row and would be cleared when the run is saved. Scheduling the row again keeps it.
      if ("more" in outcome && outcome.more) job.attrs.nextRunAt = new Date(Date.now() + SUMMARIZE_DEBOUNCE_MS);
    },
    { backoff: untilItWorks, concurrency: 4 },
  );

  agenda.define(turnJob.name, async (job) => {
    await runTurnWork(services, turnJob.schema.parse(job.attrs.data));
  }, { backoff: untilItWorks, concurrency: 4 });
  agenda.define(extractJob.name, async (job) => {
    await runExtractAll(services, extractJob.schema.parse(job.attrs.data), () => job.touch());
  }, { backoff: untilItWorks });

  agenda.define(indexSnippetsJob.name, async (job) => {
    await runIndexSnippets(services, indexSnippetsJob.schema.parse(job.attrs.data));
  }, { backoff: untilReconciled, concurrency: 2 });
  agenda.define(reconcileJob.name, async (job) => {
    await runReconcile(services, reconcileJob.schema.parse(job.attrs.data ?? {}));
  });
  agenda.define(retentionJob.name, async (job) => {
    await runRetention(services, retentionJob.schema.parse(job.attrs.data ?? {}));
  });

  await agenda.start();
  await agenda.every(COMPACTION_CRON, compactJob.name, { due: true }, { timezone: "UTC", skipImmediate: true });
  await agenda.every(RECONCILE_EVERY, reconcileJob.name, {}, { skipImmediate: true });
  await agenda.every(RETENTION_CRON, retentionJob.name, {}, { timezone: "UTC", skipImmediate: true });
  return {
    /** Takes no new jobs and lets running ones finish (a job still running after the grace period is retried later). */
    async stop(graceMs = 15_000) {
      const { running, timedOut } = await agenda.drain({ timeout: graceMs, closeConnection: false });
      if (timedOut) log.warn("jobs still running at shutdown; they will be retried", { running });
    },
  };
}
