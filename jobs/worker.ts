import type { AgendaQueue } from "../src/agenda-queue.ts";
import type { Deps } from "../src/deps.ts";
import type { Worker } from "../src/queue.ts";
import { sparingly } from "../src/log.ts";
import { withTimeout } from "../src/timeout.ts";
import { failRunsCutOffHere } from "../src/work/job-runs.ts";
import { compact } from "./compact.ts";
import { dispatch } from "./dispatch.ts";
import type { ImplementedJob } from "./implement.ts";
import { indexSnippets } from "./index-snippets.ts";
import { deleteVectors, reconcile } from "./reconcile.ts";
import { retention } from "./retention.ts";
import { summarize } from "./summarize.ts";
import { conversationTurns, extract, followUps, quietExtract, turn } from "./turn.ts";

/** Every job the worker runs; each file is a definition, the work function it calls, and its options. */
export const JOBS: ImplementedJob[] = [turn, conversationTurns, followUps, extract, quietExtract, summarize, indexSnippets, reconcile, deleteVectors, retention, compact, dispatch];

/** Registers every job on the shared queue, schedules the recurring ones and starts processing. */
export async function startWorker({ queue, deps }: { queue: AgendaQueue; deps: Deps }): Promise<Worker> {
  const { log } = deps;
  const { agenda } = queue;
  // The queue's polls fail together while the store is away: each kind of error said at most
  // every 30 s (another kind, a real bug say, is said at once).
  const queueErrors = new Map<string, (fields: object) => void>();
  agenda.on("error", (error: Error) => {
    const kind = `${error?.name}: ${String(error?.message).slice(0, 200)}`;
    if (!queueErrors.has(kind) && queueErrors.size >= 100) queueErrors.clear();
    let say = queueErrors.get(kind);
    if (!say) queueErrors.set(kind, (say = sparingly(log, "error", "job queue error", 30_000)));
    say({ error });
  });
  agenda.on("fail", (error, job) => log.warn("job failed; it will be retried", { job: job.attrs.name, error }));
  for (const job of JOBS) job.register(agenda, deps);
  await queue.startProcessing();
  for (const job of JOBS) {
    if (!job.every) continue;
    await queue.repeat(job.name, job.every.interval, job.every.payload ?? {});
  }
  return {
    /** Takes no new jobs and lets running ones finish (a job still running after the grace period is retried later). */
    async stop(graceMs = 15_000) {
      const { running, timedOut, released } = await queue.stopProcessing(graceMs);
      if (released) log.info("jobs locked but not started are free for other workers", { released });
      if (timedOut) {
        log.warn("jobs still running at shutdown; they will be retried", { running });
        // What jobRuns and the inspector show for them: cut off now, not RUNNING until the sweep.
        await withTimeout(failRunsCutOffHere(), 1_000, "").catch(() => {});
      }
    },
  };
}
