import { backoffStrategies } from "agenda";
import type { Services } from "../src/services.ts";
import { compactJob, COMPACTION_CRON, runCompaction } from "./compact.ts";
import { summarizeJob, runSummarize } from "./summarize.ts";

export type Worker = { stop(): Promise<void> };

// Model outages and crashes delay work, never lose it: retry with growing delays, without end.
const untilItWorks = backoffStrategies.exponential({ delay: 1_000, maxDelay: 300_000, maxRetries: 1_000_000 });

/** Registers every job on the shared queue, schedules the daily ones and starts processing. */
export async function startWorker(services: Services): Promise<Worker> {
  const { jobs, log } = services;
  const { agenda } = jobs;
  agenda.on("error", (error) => log.error("job queue error", { error }));
  agenda.on("fail", (error, job) => log.warn("job failed; it will be retried", { job: job.attrs.name, error }));

  agenda.define(compactJob.name, async (job) => {
    await runCompaction(services, compactJob.schema.parse(job.attrs.data ?? {}));
  });
  agenda.define(
    summarizeJob.name,
    async (job) => {
      await runSummarize(services, summarizeJob.schema.parse(job.attrs.data));
    },
    { backoff: untilItWorks, concurrency: 4 },
  );

  await agenda.start();
  await agenda.every(COMPACTION_CRON, compactJob.name, {}, { timezone: "UTC", skipImmediate: true });
  return {
    async stop() {
      await agenda.stop(false);
    },
  };
}
