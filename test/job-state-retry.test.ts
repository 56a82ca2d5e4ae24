import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dispatchJob } from "../src/queue.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
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
