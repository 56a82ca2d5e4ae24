import type { Agenda, Job, JobDefinition as AgendaJobOptions } from "agenda";
import type { z } from "zod";
import { JOB_CONCURRENCY } from "../src/agenda-queue.ts";
import type { TenantDb } from "../src/db.ts";
import type { Deps } from "../src/deps.ts";
import type { JobDefinition } from "../src/queue.ts";
import { deadLetter, UNREADABLE_TRIES, UnreadableAnswer } from "../src/work/dead-letter.ts";

/** What a running job may ask of its queue. */
export type JobControl = {
  /** Keeps the job's lock while a long run goes on. */
  stillAlive(): Promise<unknown>;
  /** Runs the same job row again after a delay (its coalesced requests stay with it). */
  runAgainIn(ms: number): void;
  /** 1 on the first run, 2 on the first retry, … */
  attempt: number;
  /** This job's row in the queue. */
  jobId: string;
  /** Counts one more unreadable model answer; returns how many came in a row (outages apart). */
  countUnreadable(): number;
};

export type JobOptions = Pick<AgendaJobOptions, "backoff" | "concurrency"> & {
  /** Scheduled runs: an interval ("5 minutes") or a cron line (UTC), with the payload they run with. */
  every?: { interval: string; payload?: Record<string, unknown> };
};

/** A job as the worker registers it. */
export type ImplementedJob = {
  name: string;
  every?: { interval: string; payload?: Record<string, unknown> };
  register(agenda: Agenda, deps: Deps): void;
};

// A job's unreadable model answers in a row are counted in its row's `progress` column: Agenda
// saves it with every state write (a failed run's included, where it never saves the payload), a
// coalesced request for the same work leaves it, and every touch here writes it back unchanged.
// Its fail count would not do: it also counts the runs a model outage failed, and never resets.
function implement<S extends z.ZodType>(
  definition: JobDefinition<S>,
  run: (deps: Deps, payload: z.infer<S>, control: JobControl) => Promise<unknown>,
  options: JobOptions,
): ImplementedJob {
  const { every, ...agendaOptions } = options;
  return {
    name: definition.name,
    every,
    register(agenda, deps) {
      agenda.define(
        definition.name,
        async (job: Job) => {
          const control: JobControl = {
            stillAlive: () => job.touch(job.attrs.progress),
            runAgainIn: (ms) => {
              job.attrs.nextRunAt = new Date(Date.now() + ms);
            },
            attempt: (job.attrs.failCount ?? 0) + 1,
            jobId: String(job.attrs._id),
            countUnreadable: () => (job.attrs.progress = (job.attrs.progress ?? 0) + 1),
          };
          // Signs of life while it runs: the lock of a job whose worker died lapses, this one's never
          // does. Each touch renews the lock in memory at once; the writes are not chained, so a slow
          // store cannot hold the next renewal back.
          const touches = new Set<Promise<unknown>>();
          const heartbeat = setInterval(() => {
            const touch = job.touch(job.attrs.progress).catch(() => {});
            touches.add(touch);
            void touch.finally(() => touches.delete(touch));
          }, deps.env.ENGRAM_JOB_LOCK_MS / 4);
          // A job still running when a shutdown's grace ends must not keep the process alive.
          heartbeat.unref();
          const unreadableBefore = job.attrs.progress;
          try {
            await run(deps, definition.schema.parse(job.attrs.data ?? {}), control);
            // A run that read its answers clears the count; one that dead-lettered (counted) keeps it.
            if (job.attrs.progress === unreadableBefore) job.attrs.progress = undefined;
          } finally {
            clearInterval(heartbeat);
            await Promise.all(touches); // a touch still in flight must not land after the job is saved
          }
        },
        // A worker locks no more rows than it may run at once, leaving the rest to other workers.
        { ...agendaOptions, lockLimit: agendaOptions.concurrency ?? JOB_CONCURRENCY },
      );
    },
  };
}

/** A job over every active tenant (or the one its payload names): the work function walks them. */
export function implementJob<S extends z.ZodType>(
  definition: JobDefinition<S>,
  run: (deps: Deps, payload: z.infer<S>, control: JobControl) => Promise<unknown>,
  options: JobOptions = {},
): ImplementedJob {
  return implement(definition, run, options);
}

/** A job for one tenant: the work function gets that tenant's scoped client, never the raw one. */
export function implementTenantJob<S extends z.ZodType<{ tenantId: string }>>(
  definition: JobDefinition<S>,
  run: (db: TenantDb, deps: Deps, payload: z.infer<S>, control: JobControl) => Promise<unknown>,
  options: JobOptions = {},
): ImplementedJob {
  return implement(
    definition,
    async (deps, payload, control) => {
      const db = deps.tenants.scoped(payload.tenantId);
      try {
        return await run(db, deps, payload, control);
      } catch (error) {
        // Unreadable answers (an extraction's or summary's refused request counts as one) are
        // retried with the backoff, then dead-lettered rather than retried forever. Only they
        // count: runs that failed on an outage before them are no tries.
        if (!(error instanceof UnreadableAnswer)) throw error;
        const tries = control.countUnreadable();
        if (tries < UNREADABLE_TRIES) throw error;
        await deadLetter(db, deps, { name: definition.name, payload, tries }, error);
      }
    },
    options,
  );
}
