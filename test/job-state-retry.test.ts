import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startWorker } from "../jobs/worker.ts";
import { conversationTurnsJob, dispatchJob, type Worker } from "../src/queue.ts";
import { modelEnv, startEngramWithModel, startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { startSecondInstance, type TestInstance } from "./helpers/instances.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { recordTurn } from "./helpers/turns.ts";
import { until } from "./helpers/until.ts";

// Agenda ignores a failed write of a job's end, which left the job's row locked for the lock's
// 10 minutes after a full disk (test/faults/disk-full). Here the store refuses that one write
// for a second and a half, as a full disk would, and the job is unlocked once it accepts it again.
describe("a job whose end cannot be written at first", () => {
  let engram: TestEngram;
  beforeAll(async () => {
    engram = await startTestEngram({ worker: true });
    await engram.services.db.$executeRawUnsafe(`CREATE TABLE "test_refuse_unlock" ("on" boolean)`);
    await engram.services.db.$executeRawUnsafe(`
      CREATE FUNCTION "test_refuse_unlock"() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF OLD."locked_at" IS NOT NULL AND NEW."locked_at" IS NULL AND EXISTS (SELECT 1 FROM "test_refuse_unlock") THEN
          RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
        END IF;
        RETURN NEW;
      END $$`);
    await engram.services.db.$executeRawUnsafe(
      `CREATE TRIGGER "test_refuse_unlock" BEFORE UPDATE ON "agenda_jobs" FOR EACH ROW EXECUTE FUNCTION "test_refuse_unlock"()`,
    );
  });
  afterAll(async () => {
    await engram.services.db.$executeRawUnsafe(`DROP TRIGGER IF EXISTS "test_refuse_unlock" ON "agenda_jobs"`).catch(() => {});
    await engram?.stop();
  });

  it("is unlocked as soon as the store takes writes again, not when its lock lapses", async () => {
    const { db, queue } = engram.services;
    await db.$executeRawUnsafe(`INSERT INTO "test_refuse_unlock" VALUES (true)`);
    await queue.enqueue(dispatchJob, {});
    const row = () =>
      db.$queryRawUnsafe<{ lastRunAt: Date | null; lockedAt: Date | null; lastFinishedAt: Date | null }[]>(
        `SELECT "last_run_at" AS "lastRunAt", "locked_at" AS "lockedAt", "last_finished_at" AS "lastFinishedAt"
         FROM "agenda_jobs" WHERE "name" = $1 AND "next_run_at" IS NULL ORDER BY "last_run_at" DESC NULLS LAST LIMIT 1`,
        dispatchJob.name,
      );
    await until("the job to start", async () => Boolean((await row())[0]?.lastRunAt), 30_000);
    // The run itself takes milliseconds: by now its end has been refused at least once.
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect((await row())[0].lockedAt).not.toBeNull();
    await db.$executeRawUnsafe(`DELETE FROM "test_refuse_unlock"`);
    await until("the job to be unlocked", async () => (await row())[0].lockedAt === null, 30_000);
    expect((await row())[0].lastFinishedAt).not.toBeNull();
  });
});

// A worker locks no more of a job's rows than it runs at once, and a graceful stop gives back at
// once the rows it had locked but not started. Before, it locked a whole backlog, kept starting
// it during the grace, and left the rest locked for the lock lifetime (10 minutes on PostgreSQL).
describe("a worker stopped in front of a backlog", () => {
  let engram: TestEngram;
  let model: ModelServer;
  let second: TestInstance | undefined;
  const workers: Worker[] = [];
  const env = { ENGRAM_MODEL_TIMEOUT_MS: "600000", ENGRAM_JOB_POLL_MS: "200" };
  beforeAll(async () => {
    // Every model call hangs: each job that starts stays running.
    ({ model, engram } = await startEngramWithModel({ respond: () => new Promise<never>(() => {}), env }));
  }, 120_000);
  afterAll(async () => {
    for (const worker of workers) await worker.stop(100).catch(() => {});
    await second?.stop().catch(() => {});
    await model?.stop();
    await engram?.stop();
  });

  const rows = async () => {
    const [row] = await engram.services.db.$queryRawUnsafe<{ locked: number; running: number }[]>(
      `SELECT count(*) FILTER (WHERE "locked_at" IS NOT NULL)::int AS "locked",
              count(*) FILTER (WHERE "locked_at" IS NOT NULL AND "last_run_at" IS NOT NULL
                               AND ("last_finished_at" IS NULL OR "last_run_at" > "last_finished_at"))::int AS "running"
       FROM "agenda_jobs" WHERE "name" = $1`,
      conversationTurnsJob.name,
    );
    return row;
  };

  it("locks only what it runs, leaves the rest to another worker, and frees what it had not started", async () => {
    const first = await startWorker(engram.services);
    workers.push(first);
    // Each turn's conversation gets a gate job, whose model call hangs.
    for (let i = 0; i < 12; i++) await recordTurn(engram, { userMessage: "I moved to Lisbon last week.", conversationExternalId: `backlog-${i}` });
    await until("4 gate jobs to hang (the job's concurrency)", async () => {
      if ((await rows()).running !== 4) return false;
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      return (await rows()).running === 4;
    }, 60_000);
    // Polls later, the worker still holds only the rows it runs.
    expect(await rows()).toEqual({ locked: 4, running: 4 });

    await first.stop(300);
    expect(await rows()).toEqual({ locked: 4, running: 4 });

    second = await startSecondInstance(engram, { ...modelEnv(model), ...env });
    const start = Date.now();
    workers.push(await startWorker(second.services));
    await until("another worker to take 4 more", async () => (await rows()).running === 8, 10_000);
    expect(Date.now() - start).toBeLessThan(5_000);
  }, 120_000);
});

// Agenda's every() set a recurring job's next run one interval from now at each instance's start:
// restarts closer together than a minute (a rolling restart, a crash loop) kept pushing the outbox
// dispatcher back, and a turn left in the outbox waited minutes instead of at most 90 s.
describe("an instance starting beside another", () => {
  let engram: TestEngram;
  let second: TestInstance | undefined;
  let secondWorker: Worker | undefined;
  beforeAll(async () => {
    engram = await startTestEngram({ worker: true });
  });
  afterAll(async () => {
    await secondWorker?.stop(1_000);
    await second?.stop();
    await engram?.stop();
  });

  it("keeps the recurring jobs' next runs that are sooner than its own interval", async () => {
    const { db } = engram.services;
    const nextRun = async () =>
      (await db.$queryRawUnsafe<{ at: Date }[]>(`SELECT "next_run_at" AS "at" FROM "agenda_jobs" WHERE "name" = $1 AND "type" = 'single'`, dispatchJob.name))[0]
        .at;
    await until("the dispatcher to be scheduled", async () => Boolean(await nextRun().catch(() => null)), 30_000);
    // Due in 20 s, as a minute-old schedule would be.
    const soon = new Date(Date.now() + 20_000);
    await db.$executeRawUnsafe(`UPDATE "agenda_jobs" SET "next_run_at" = $2 WHERE "name" = $1 AND "type" = 'single'`, dispatchJob.name, soon);
    second = await startSecondInstance(engram);
    secondWorker = await startWorker({ queue: second.services.queue, deps: second.services.deps });
    expect((await nextRun()).getTime()).toBe(soon.getTime());
  });
});
