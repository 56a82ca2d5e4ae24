import { PostgresBackend } from "@agendajs/postgres-backend";
import { Agenda, type Job } from "agenda";
import type { z } from "zod";
import { createPool } from "./db.ts";
import { sparingly, type Logger } from "./log.ts";
import type { Store } from "./embedded/embedded.ts";
import type { JobQueue } from "./queue.ts";

/** The durable queue on the store's own database (Agenda); producers and the worker share it. */
export type AgendaQueue = JobQueue & {
  agenda: Agenda;
  /** Resolves when the queue's database answers (for /healthz). */
  ping(): Promise<void>;
  /**
   * The jobs due more than `overMs` ago that no worker has started, when no job is running and
   * none finished within `overMs` either (for /healthz): none while some worker takes work, a
   * backlog included; a retry waiting on its backoff is not due.
   */
  late(overMs: number): Promise<{ jobs: number; dueSince: Date | null }>;
  /** Gives up connecting, if it still is (shutdown, before it waits for a worker that is starting). */
  stopConnecting(): void;
  /** Starts running the defined jobs in this process. */
  startProcessing(): Promise<void>;
  /**
   * Runs a job every interval (Agenda's `every`, its first run one interval from now), keeping
   * the next run the job already had when that is sooner.
   */
  repeat(name: string, interval: string, payload: Record<string, unknown>): Promise<void>;
  /**
   * Starts no more jobs, unlocks at once the rows this process locked but had not started, and
   * waits up to graceMs for the running ones (whose rows stay locked if they outlast it).
   */
  stopProcessing(graceMs: number): Promise<{ running: number; timedOut: boolean; released: number }>;
};

/** How many jobs of one name a worker runs at once unless its definition says (Agenda's default too). */
export const JOB_CONCURRENCY = 5;

/** The parts of Agenda's job processor (agenda 6.2, private) that a worker's lock bounds and shutdown use. */
type JobProcessor = {
  isRunning: boolean;
  runningJobs: Job[];
  jobQueue: { getQueue(): Job[] };
  /** Stops polling and listening; returns the jobs locked here that have not started. */
  stop(): Job[];
  shouldLock(name: string): boolean;
  updateStatus(name: string, key: "locked" | "running", change: number): void;
  jobQueueFilling(name: string): Promise<void>;
  jobProcessing(): Promise<void>;
};

const processorOf = (agenda: Agenda) => (agenda as unknown as { jobProcessor?: JobProcessor }).jobProcessor;

/**
 * A job's definition caps the rows a worker locks at its concurrency (jobs/implement.ts): Agenda's
 * default is no cap, so one worker locked a whole backlog and other workers idled beside it.
 * With the cap, Agenda would lock the next row only at its next poll; this locks it as soon as a
 * job ends, so a backlog still runs back to back.
 */
function lockNextWhenOneEnds(processor: JobProcessor, log: Logger) {
  const updateStatus = processor.updateStatus.bind(processor);
  processor.updateStatus = (name, key, change) => {
    updateStatus(name, key, change);
    if (key !== "running" || change >= 0) return;
    // Agenda releases the ended job's lock slot just after this, in the same tick.
    setImmediate(() => {
      if (!processor.isRunning) return;
      processor
        .jobQueueFilling(name)
        .then(() => processor.jobProcessing())
        .catch((error: unknown) => log.warn("job queue: could not take the next job", { job: name, error }));
    });
  };
}

const QUEUE_POOL_SIZE = 8; // on PostgreSQL

/** The wait before a retry: 250 ms, doubling, at most 5 s. */
const backoff = (attempt: number) => Math.min(250 * 2 ** attempt, 5_000);

/** How long a job's state write is retried while the store refuses it (a full disk, a restart). */
const STATE_SAVE_RETRY_MS = 120_000;

/** A store that is away or out of room (SQLSTATE 08 connection, 53 resources, 57P shutdown), not a bad statement. */
function isTransient(error: unknown): boolean {
  const { code, message } = error as { code?: unknown; message?: string };
  if (typeof code === "string" && /^(08|53|57P)/.test(code)) return true;
  if (typeof code === "string" && /^E(CONN|PIPE|TIMEDOUT|HOSTUNREACH|NETUNREACH)/.test(code)) return true;
  return /Connection terminated|connection (is )?closed|Client has encountered a connection error|timeout exceeded when trying to connect/i.test(message ?? "");
}

/**
 * Agenda ignores a failed write of a job's end (the one that unlocks it), and a failed write of
 * its start leaves the lock it has just taken: either way the job's row stays locked until the
 * lock lifetime lapses (10 minutes by default), which after a full disk under load held turns'
 * follow-ups and the outbox's dispatcher that long (test/faults/disk-full). These writes are
 * retried with backoff while the store is away or full, for at most half the lock lifetime (and
 * 2 minutes): never so long that the lock lapses and another worker's run is overwritten.
 */
function retryJobStateSaves(backend: PostgresBackend, options: { lockMs: number }, log: Logger, pause: (ms: number) => Promise<boolean>) {
  const repository = backend.repository;
  const save = repository.saveJobState.bind(repository);
  const retryFor = Math.min(STATE_SAVE_RETRY_MS, options.lockMs / 2);
  repository.saveJobState = async (...args) => {
    const deadline = Date.now() + retryFor;
    for (let attempt = 0; ; attempt++) {
      try {
        const saved = await save(...args);
        if (attempt > 0) log.info("job queue: saved a job's state after the store came back", { job: args[0].name, attempts: attempt + 1 });
        return saved;
      } catch (error) {
        if (!isTransient(error)) throw error;
        if (Date.now() > deadline || !(await pause(backoff(attempt)))) {
          log.error("job queue: gave up saving a job's state; it runs again once its lock lapses", { job: args[0].name, error });
          throw error;
        }
        if (attempt === 0) log.warn("job queue: could not save a job's state; retrying", { job: args[0].name, error });
      }
    }
  };
}

/**
 * A coalesced job's request (`nowDebounced`) that lands while the job runs moves the row's next
 * run, and Agenda's saves of the run (its start, a heartbeat's `touch`, the save of its end)
 * wrote the run's own next run over it: none for a one-off job, so the request was lost and the
 * work it asked for (an import's extraction, say) waited for another request that might never
 * come. Every save of a run after its start keeps the earlier of the two instead. The save of the
 * start (the first with a lock) is the one that clears a one-off job's next run and sets a
 * repeating job's, so it writes the run's own only where the row still holds the next run it had
 * when it was locked (read back by the lock's statement, kept here until the start is saved), and
 * the earlier of the two where a request has moved it since. Nothing else writes a running job's
 * row, so a next run that differs is a request's. The statement is the backend's own
 * (@agendajs/postgres-backend 3.0.6, `saveJobState`) with that one change.
 */
function keepRequestsMadeDuringARun(backend: PostgresBackend, pool: ReturnType<typeof createPool>, lockMs: number) {
  const repository = backend.repository;
  const save = repository.saveJobState.bind(repository);
  // The runs (Agenda's job attributes, one object for a run's saves) whose start has been saved.
  const started = new WeakSet<object>();
  // A repeating run's next occurrence, as Agenda set it at the start: its end schedules no later.
  const occurrences = new WeakMap<object, Date | null>();
  // A locked job's id -> its lock's time and the next run its row held then (a request since moves it).
  const locked = new Map<string, { lockedAt: number; nextRunAt: Date | null }>();
  const remember = <T extends { _id?: unknown; lockedAt?: Date; nextRunAt?: Date | null } | undefined>(job: T): T => {
    if (!job?._id || !job.lockedAt) return job;
    const now = Date.now();
    // A job locked and then dropped unrun (its lock lapsed in the worker's queue) is never started.
    if (locked.size > 1_000) for (const [id, lock] of locked) if (lock.lockedAt < now - 2 * lockMs) locked.delete(id);
    locked.set(String(job._id), { lockedAt: job.lockedAt.getTime(), nextRunAt: job.nextRunAt ?? null });
    return job;
  };
  const getNextJobToRun = repository.getNextJobToRun.bind(repository);
  repository.getNextJobToRun = async (...args) => remember(await getNextJobToRun(...args));
  const lockJob = repository.lockJob.bind(repository);
  repository.lockJob = async (...args) => remember(await lockJob(...args));
  repository.saveJobState = async (job, options) => {
    if (!job._id) return save(job, options);
    const id = String(job._id);
    // The start's save: the next run the row held at the lock, if this process locked it.
    let atLock: { nextRunAt: Date | null } | undefined;
    if (job.lockedAt && !started.has(job)) {
      const lock = locked.get(id);
      // Not this process's lock (never so for a run): the backend's own save.
      if (!lock || lock.lockedAt !== job.lockedAt.getTime()) return save(job, options).then(() => void started.add(job));
      atLock = lock;
    }
    // A repeating job's row stays due while a run holds it (its start, its signs of life) and
    // takes the run's next occurrence at the end (its retry instead, when sooner): Agenda wrote
    // the next occurrence at the start, so a run cut off (a shutdown's grace over, a killed
    // worker) left a row that the worker taking its lapsed lock found not due and gave back, and
    // the nightly retention was skipped until the next night. Otherwise: at the start, the run's
    // own next run where the row's is unmoved since the lock (within the driver's millisecond: it
    // cuts a timestamp's microseconds); otherwise the earlier of the two.
    const repeating = Boolean(job.repeatInterval || job.repeatAt);
    if (repeating && atLock) occurrences.set(job, job.nextRunAt ?? null);
    const result = await pool.query(
      `UPDATE "agenda_jobs"
       SET locked_at = $2, last_run_at = $4, progress = $5, fail_reason = $6,
           fail_count = $7, failed_at = $8, last_finished_at = $9, last_modified_by = $11,
           next_run_at = CASE
             WHEN $14::boolean AND $2::timestamptz IS NOT NULL THEN next_run_at
             WHEN $14::boolean THEN LEAST($3::timestamptz, $15::timestamptz)
             WHEN $12::boolean AND (next_run_at IS NULL AND $13::timestamptz IS NULL OR abs(extract(epoch FROM next_run_at - $13::timestamptz)) < 0.001) THEN $3
             ELSE LEAST(next_run_at, $3) END
       WHERE id = $1 AND name = $10`,
      [
        id,
        job.lockedAt || null,
        job.nextRunAt || null,
        job.lastRunAt || null,
        job.progress ?? null,
        job.failReason ?? null,
        job.failCount ?? null,
        job.failedAt || null,
        job.lastFinishedAt || null,
        job.name,
        options?.lastModifiedBy || null,
        atLock !== undefined,
        atLock?.nextRunAt ?? null,
        repeating,
        (repeating && occurrences.get(job)) || null,
      ],
    );
    // As the backend's: Agenda logs it and goes on (the row was deleted meanwhile).
    if (result.rowCount !== 1) throw new Error(`job ${id} (name: ${job.name}) cannot be updated in the database, maybe it does not exist anymore?`);
    if (atLock) {
      // Only now: a save retried after a lost connection (retryJobStateSaves) is still the start's.
      locked.delete(id);
      started.add(job);
    }
  };
}

/**
 * On PGlite, LISTEN/NOTIFY does not reach other connections, so jobs wait for the poll there.
 */
// A job waiting to run ($1 its name, $2 the payload key, $3 the key's values): queued or due for a
// retry (a next run), and not running (no lock). JobQueue.waiting reads them, JobQueue.hurry moves them.
const WAITING_ROWS = `"name" = $1 AND "data"->>$2 = ANY($3::text[]) AND "next_run_at" IS NOT NULL AND "locked_at" IS NULL`;

export function createAgendaQueue(store: Store, options: { pollMs: number; lockMs: number }, log: Logger): AgendaQueue {
  // On PostgreSQL the LISTEN connection holds one of these for good; producers (every recordTurn's
  // enqueue) and the worker's polls, locks and saves share the rest. With 3, a soak's recordTurn
  // waited seconds for a connection on PostgreSQL (bench/README.md, "Soak"). The embedded store
  // runs one statement at a time whatever the pool, so it keeps 3.
  const pool = createPool(store.url, store.embedded ? 3 : QUEUE_POOL_SIZE, (error) => log.warn("job queue connection lost", { error }));
  const backend = new PostgresBackend({ pool, disableNotifications: store.embedded });
  // Its LISTEN connection re-emits its errors on the channel, which reconnects by itself: unheard,
  // a PostgreSQL restart would crash the process (test/faults/store-kill).
  // It retries every ~0.1 s while the store is away: said at most every 30 s (once every retry, a
  // 10 s outage wrote 140 lines).
  const notificationsLost = sparingly(log, "warn", "job notifications: connection lost; reconnecting", 30_000);
  backend.notificationChannel?.on("error", (error) => notificationsLost({ error }));
  // Agenda connects from its constructor and never catches: a store down at that moment was an
  // unhandled rejection, and `agenda.ready` (which every enqueue and close awaits) never settled.
  // Connecting is retried until it works, or until the queue is closed.
  let closed = false;
  // The retries' sleeps (connecting, job-state writes): ms, or until the queue closes; false once it has.
  const sleepers = new Set<() => void>();
  const pause = (ms: number) =>
    new Promise<boolean>((resolve) => {
      if (closed) return resolve(false);
      const done = () => (clearTimeout(timer), sleepers.delete(done), resolve(!closed));
      const timer = setTimeout(done, ms);
      timer.unref();
      sleepers.add(done);
    });
  const wakeSleepers = () => {
    for (const done of sleepers) done();
  };
  const connectOnce = backend.connect.bind(backend);
  backend.connect = async () => {
    for (let attempt = 0; ; attempt++) {
      try {
        return await connectOnce();
      } catch (error) {
        if (closed) return;
        if (attempt === 0) log.warn("job queue: cannot reach the database; retrying", { error });
        if (!(await pause(backoff(attempt)))) return;
      }
    }
  };
  keepRequestsMadeDuringARun(backend, pool, options.lockMs);
  retryJobStateSaves(backend, options, log, pause);
  // Agenda gives back a lock it may not keep without awaiting it; one that arrives as the queue
  // shuts down met an ended pool, and its rejection, unheard, ended the process (readme test on
  // PostgreSQL). A lock not given back only lapses, so a failure here is logged, never thrown.
  const unlockJob = backend.repository.unlockJob.bind(backend.repository);
  backend.repository.unlockJob = async (job) => {
    try {
      await unlockJob(job);
    } catch (error) {
      if (!closed) log.warn("job queue: could not give back a job's lock; it lapses instead", { job: job.name, error });
    }
  };
  const agenda = new Agenda({
    backend,
    processEvery: options.pollMs,
    defaultLockLifetime: options.lockMs,
    defaultConcurrency: JOB_CONCURRENCY,
    defaultLockLimit: JOB_CONCURRENCY,
  });
  // A coalesced job's wait (and its longest, maxWait) starts with the first request after its
  // last run. Agenda keeps a wait's start on the row across runs, so the first request after a
  // spell longer than maxWait ran the job at once (a quiet-period timer fired on the first message
  // of a conversation taken up again). A run that leaves the job with nothing to do ends its wait:
  // one statement by the row's id, once the run's end is saved (which does not write this column),
  // and only while the row is still idle (a request since then waits as it asked).
  agenda.on("complete", (job: Job) => {
    if (job.attrs.nextRunAt || !job.attrs._id) return;
    pool
      .query(
        `UPDATE "agenda_jobs" SET "debounce_started_at" = NULL
         WHERE "id" = $1 AND "debounce_started_at" IS NOT NULL AND "next_run_at" IS NULL AND "locked_at" IS NULL`,
        [String(job.attrs._id)],
      )
      .catch((error: unknown) => {
        if (!closed) log.warn("job queue: could not end a coalesced job's wait; its next request may run it at once", { job: job.attrs.name, error });
      });
  });
  // Agenda's debounce reads then writes; chaining one key's submissions in this process keeps
  // a burst from one API instance from racing itself into several jobs.
  const chains = new Map<string, Promise<unknown>>();
  const inOrder = (key: string, work: () => Promise<unknown>) => {
    const next = (chains.get(key) ?? Promise.resolve()).catch(() => {}).then(work);
    chains.set(key, next);
    void next.finally(() => chains.get(key) === next && chains.delete(key)).catch(() => {});
    return next;
  };
  // key -> when the job queued for it runs (epoch ms).
  const soon = new Map<string, number>();
  return {
    agenda,
    async enqueue(job, payload, options) {
      const data = job.schema.parse(payload);
      if (options?.delayMs) await agenda.schedule(new Date(Date.now() + options.delayMs), job.name, data);
      else await agenda.now(job.name, data);
    },
    async enqueueCoalesced(job, payload, key, debounceMs) {
      const data = job.schema.parse(payload) as Record<string, unknown>;
      const submit = () => agenda.nowDebounced(job.name, data, { [`data.${key}`]: data[key] }, debounceMs, { maxWait: debounceMs * 10 });
      // The save reads the job's row, then updates it. If the nightly prune of finished jobs
      // (pruneFinishedJobs) deleted that row in between, the update finds none and the backend
      // throws a TypeError on the missing row; once more, the read finds none and inserts.
      await inOrder(`${job.name}:${String(data[key])}`, () => submit().catch((error: unknown) => (error instanceof TypeError ? submit() : Promise.reject(error))));
    },
    async enqueueSoon(job, payload, key, windowMs) {
      const data = job.schema.parse(payload) as Record<string, unknown>;
      const id = `${job.name}:${String(data[key])}`;
      const now = Date.now();
      // The queued job has not started yet (Agenda never runs a job before its time), so it will see this write.
      if ((soon.get(id) ?? 0) > now) return;
      const runAt = now + windowMs;
      soon.set(id, runAt);
      if (soon.size > 10_000) for (const [k, at] of soon) if (at <= now) soon.delete(k);
      try {
        await agenda.schedule(new Date(runAt), job.name, data);
      } catch (error) {
        if (soon.get(id) === runAt) soon.delete(id);
        throw error;
      }
    },
    async waiting(job, key, values, exceptJobId) {
      if (values.length === 0) return new Set<string>();
      const { rows } = await pool.query<{ value: string }>(
        `SELECT DISTINCT "data"->>$2 AS "value" FROM "agenda_jobs" WHERE ${WAITING_ROWS} AND ($4::uuid IS NULL OR "id" <> $4::uuid)`,
        [job.name, key, values, exceptJobId ?? null],
      );
      return new Set(rows.map((r) => r.value));
    },
    async hurry(job, key, values) {
      if (values.length === 0) return new Set<string>();
      const { rows } = await pool.query<{ value: string }>(
        `UPDATE "agenda_jobs" SET "next_run_at" = LEAST("next_run_at", now()) WHERE ${WAITING_ROWS} RETURNING "data"->>$2 AS "value"`,
        [job.name, key, values],
      );
      return new Set(rows.map((r) => r.value));
    },
    async ping() {
      await pool.query("SELECT 1");
    },
    async late(overMs) {
      const { rows } = await pool.query<{ jobs: number; dueSince: Date | null }>(
        // Late, and nothing taken meanwhile: a worker busy with a backlog (each job name runs at
        // most its concurrency at once) has jobs locked or finished within the window. Only a
        // lock younger than its lifetime is a worker's (a running job renews its lock): one left by
        // a worker that was killed stays on its row until another worker takes the job, and
        // counted, it said ok for as long as no worker ran.
        `SELECT count(*)::int AS "jobs", min("next_run_at") AS "dueSince" FROM "agenda_jobs"
         WHERE "next_run_at" < now() - $1 * interval '1 millisecond' AND "disabled" IS NOT TRUE
           AND ("locked_at" IS NULL OR "locked_at" <= now() - $2 * interval '1 millisecond')
           AND NOT EXISTS (SELECT 1 FROM "agenda_jobs" WHERE "locked_at" > now() - $2 * interval '1 millisecond' OR "last_finished_at" > now() - $1 * interval '1 millisecond')`,
        [overMs, options.lockMs],
      );
      return rows[0];
    },
    stopConnecting() {
      closed = true;
      wakeSleepers();
    },
    async repeat(name, interval, payload) {
      // Agenda's every() sets the next run one interval from now each time it is called, that is
      // at every instance's start: restarts closer together than the interval (a rolling restart
      // of three instances, a crash loop) pushed the dispatcher and the reconciler back for good.
      const single = `"name" = $1 AND "type" = 'single'`;
      const { rows } = await pool.query<{ at: Date | null }>(`SELECT "next_run_at" AS "at" FROM "agenda_jobs" WHERE ${single}`, [name]);
      await agenda.every(interval, name, payload, { timezone: "UTC", skipImmediate: true });
      const before = rows[0]?.at;
      // Also under a run that holds the row: the run's end writes its own next run over it, and a
      // run that never ends (its worker killed) is run again once its lock lapses, as it is due.
      if (before) await pool.query(`UPDATE "agenda_jobs" SET "next_run_at" = $2 WHERE ${single} AND "next_run_at" > $2`, [name, before]);
    },
    async startProcessing() {
      await agenda.start();
      const processor = processorOf(agenda);
      if (processor) lockNextWhenOneEnds(processor, log);
    },
    async stopProcessing(graceMs) {
      const processor = processorOf(agenda);
      if (!processor) return { running: 0, timedOut: false, released: 0 };
      // agenda.drain() alone kept starting the jobs it had locked during the grace, and left the
      // rest locked for the lock lifetime: its processor was gone when agenda.stop() came to unlock them.
      // A lock still on its way from the store is given back by Agenda when it may not keep it.
      processor.shouldLock = () => false;
      const unstarted = processor.stop();
      processor.jobQueue.getQueue().splice(0);
      if (unstarted.length) {
        try {
          await backend.repository.unlockJobs(unstarted.map((job) => job.attrs._id!));
        } catch (error) {
          log.warn("job queue: could not unlock the jobs this worker had not started; they run once their locks lapse", { jobs: unstarted.length, error });
        }
      }
      const { running, timedOut } = await agenda.drain({ timeout: graceMs, closeConnection: false });
      return { running, timedOut, released: unstarted.length };
    },
    async close() {
      closed = true;
      wakeSleepers();
      // Agenda connects from its constructor: ending the pool mid-connect crashes the process.
      await agenda.ready;
      await agenda.stop(true);
      await pool.end();
    },
  };
}
