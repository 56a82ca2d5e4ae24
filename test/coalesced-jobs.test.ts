import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Job } from "agenda";
import { z } from "zod";
import type { AgendaQueue } from "../src/agenda-queue.ts";
import { defineJob, quietExtractJob } from "../src/queue.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { until } from "./helpers/until.ts";

// A coalesced job (the quiet-period timer, a summary request) runs once its requests pause for
// its delay, or by its longest wait (10 delays) while they go on. Its wait starts with the first
// request after its last run, not with the first request ever.

let engram: TestEngram;
beforeAll(async () => {
  // A real worker; no model, so the quiet-period job runs and finds nothing to call.
  engram = await startTestEngram({ worker: true, env: { ENGRAM_JOB_POLL_MS: "200" } });
}, 120_000);
afterAll(() => engram?.stop());

type Row = { nextRunAt: Date | null; waitStartedAt: Date | null; lastFinishedAt: Date | null };
const row = async (conversationId: string) => {
  const [found] = await engram.services.db.$queryRaw<Row[]>`
    SELECT "next_run_at" AS "nextRunAt", "debounce_started_at" AS "waitStartedAt", "last_finished_at" AS "lastFinishedAt"
    FROM "agenda_jobs" WHERE "name" = ${quietExtractJob.name} AND "data"->>'conversationId' = ${conversationId}`;
  return found;
};
const jobRow = async (name: string) => {
  const [found] = await engram.services.db.$queryRaw<Row[]>`
    SELECT "next_run_at" AS "nextRunAt", "debounce_started_at" AS "waitStartedAt", "last_finished_at" AS "lastFinishedAt" FROM "agenda_jobs" WHERE "name" = ${name}`;
  return found;
};
const request = (conversationId: string) =>
  engram.services.queue.enqueueCoalesced(quietExtractJob, { tenantId: engram.tenant.tenantId, conversationId }, "conversationId", 60_000);
const pretendWaitBegan = (conversationId: string, ago: string, runNow: boolean) => engram.services.db.$executeRaw`
  UPDATE "agenda_jobs" SET "debounce_started_at" = now() - ${ago}::interval, "next_run_at" = CASE WHEN ${runNow} THEN now() ELSE "next_run_at" END
  WHERE "name" = ${quietExtractJob.name} AND "data"->>'conversationId' = ${conversationId}`;

describe("a coalesced job's wait", () => {
  it("starts afresh with the first request after a run, however long ago the wait before that run began", async () => {
    await request("after-a-run");
    // That wait began two hours ago (its longest is 10 minutes), and the job runs now.
    await pretendWaitBegan("after-a-run", "2 hours", true);
    await until("the job's run to end its wait", async () => {
      const now = await row("after-a-run");
      return now.lastFinishedAt !== null && now.waitStartedAt === null;
    }, 30_000);
    // A request an hour on (say) waits its delay: before, it ran the job at once.
    await request("after-a-run");
    const after = await row("after-a-run");
    expect(after.nextRunAt!.getTime()).toBeGreaterThan(Date.now() + 50_000);
  }, 60_000);

  it("still runs by its longest wait while requests go on with no run between", async () => {
    await request("no-pause");
    await pretendWaitBegan("no-pause", "2 hours", false);
    await request("no-pause");
    // Due now: the worker may have taken it already (a running job has no next run).
    const now = await row("no-pause");
    expect(now.nextRunAt === null || now.nextRunAt.getTime() <= Date.now()).toBe(true);
    await until("its run", async () => (await row("no-pause")).lastFinishedAt, 30_000);
  }, 60_000);
});

describe("a request that lands while its job runs", () => {
  it("runs the job again after that run, as it asked (Agenda's save of the run's end wrote over it)", async () => {
    const job = defineJob({ name: "test.coalesced-held-open", schema: z.object({ key: z.string() }) });
    const runs: Job[] = [];
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    (engram.services.queue as AgendaQueue).agenda.define(job.name, async (running: Job) => {
      runs.push(running);
      if (runs.length === 1) await held;
    });
    const request = () => engram.services.queue.enqueueCoalesced(job, { key: "k" }, "key", 300);
    await request();
    await until("the first run to start", async () => runs.length === 1, 30_000);
    // While it runs: a request for more work, which the run in progress may not have seen, and
    // then the run's heartbeat (a save of its lock, which wrote its own next run too).
    await request();
    await runs[0].touch();
    release();
    await until("a second run, for the request made during the first", async () => runs.length >= 2, 30_000);
    // And no third: the second run's end leaves nothing due.
    await until("the second run's end", async () => (await jobRow(job.name)).lastFinishedAt! >= runs[1].attrs.lastRunAt!, 30_000);
    expect((await jobRow(job.name)).nextRunAt).toBeNull();
    expect(runs).toHaveLength(2);
  }, 60_000);

  it("runs the job again when the request lands between the job's lock and the save of its start", async () => {
    const job = defineJob({ name: "test.coalesced-at-start", schema: z.object({ key: z.string() }) });
    const runs: Job[] = [];
    const queue = engram.services.queue as AgendaQueue;
    queue.agenda.define(job.name, async (running: Job) => void runs.push(running));
    const request = () => queue.enqueueCoalesced(job, { key: "k" }, "key", 300);
    // The first save of a locked run of this job is its start's: a request goes in just before it.
    const repository = queue.agenda.db;
    const save = repository.saveJobState.bind(repository);
    let raced = false;
    repository.saveJobState = async (attrs, options) => {
      if (attrs.name === job.name && attrs.lockedAt && !raced) {
        raced = true;
        await request();
      }
      return save(attrs, options);
    };
    try {
      await request();
      await until("a second run, for the request made as the first started", async () => runs.length >= 2, 30_000);
      await until("the second run's end", async () => (await jobRow(job.name)).lastFinishedAt! >= runs[1].attrs.lastRunAt!, 30_000);
      expect((await jobRow(job.name)).nextRunAt).toBeNull();
      expect(runs).toHaveLength(2);
    } finally {
      repository.saveJobState = save;
    }
  }, 60_000);
});
