import { OutputParserException } from "@langchain/core/output_parsers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { EngramError } from "../src/errors.ts";
import { TimedOut } from "../src/timeout.ts";
import { failRunsCutOffHere, failRunsOfTheDead, recordJobRun, SHUT_DOWN_RUN, STOPPED_RUN } from "../src/work/job-runs.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { until } from "./helpers/until.ts";

// A failed job run is readable by any key of the tenant (jobRuns): it says what failed in words
// written for readers, never a driver's or a client's own message, nor a model's answer.
describe("a failed job run's error", () => {
  let engram: TestEngram;
  beforeAll(async () => {
    engram = await startTestEngram();
  }, 120_000);
  afterAll(() => engram?.stop());

  const failWith = async (error: Error) => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    await expect(recordJobRun(db, engram.services.pubsub, "test.job", () => Promise.reject(error))).rejects.toBe(error);
    const { data } = await engram.gql(`{ jobRuns(name: "test.job", first: 1) { status error } }`, {}, engram.tenant.reader);
    return data.jobRuns[0];
  };

  it("keeps an Engram error's and a timeout's words", async () => {
    expect(await failWith(new EngramError("MODEL_UNAVAILABLE", "model provider answered 403"))).toEqual({ status: "FAILED", error: "model provider answered 403" });
    expect((await failWith(new TimedOut("Chroma gave no answer within 5000 ms"))).error).toBe("Chroma gave no answer within 5000 ms");
  });

  it("says only that it failed for anything else, and never quotes a model's answer", async () => {
    const driver = new Error("connect ECONNREFUSED 10.0.4.7:5432 (postgres://engram@db.internal/engram)");
    expect((await failWith(driver)).error).toBe("failed unexpectedly (the server's log has the error)");
    const unreadable = new OutputParserException("Failed to parse. Text: \"My locker code is 4471\"", "My locker code is 4471");
    expect((await failWith(unreadable)).error).toBe("the model's answer could not be read");
  });
});

// A run left RUNNING by a process that stopped (on PostgreSQL other instances may still be running
// theirs, so a start cannot close them all, as the embedded store's does): its sign of life stops.
describe("a job run whose process stopped", () => {
  let engram: TestEngram;
  beforeAll(async () => {
    engram = await startTestEngram();
  }, 120_000);
  afterAll(() => engram?.stop());

  it("writes a sign of life while it runs, and is marked FAILED by the sweep once it has none for 5 minutes", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    let finish!: () => void;
    const running = recordJobRun(db, engram.services.pubsub, "test.alive", () => new Promise((resolve) => (finish = () => resolve({ status: "SUCCEEDED", result: {} }))), 50);
    const alive = async () => (await db.jobRun.findFirstOrThrow({ where: { name: "test.alive" } })).heartbeatAt!.getTime();
    await until("the run to start", async () => finish !== undefined, 10_000);
    const first = await alive();
    await until("a sign of life after its start", async () => (await alive()) > first, 10_000);
    // One that died ten minutes ago, and one recorded before runs had signs of life.
    const tenMinutesAgo = new Date(Date.now() - 10 * 60_000);
    const dead = await db.jobRun.create({ data: { tenantId: engram.tenant.tenantId, name: "test.dead", status: "RUNNING", startedAt: tenMinutesAgo, heartbeatAt: tenMinutesAgo } });
    const old = await db.jobRun.create({ data: { tenantId: engram.tenant.tenantId, name: "test.old", status: "RUNNING", startedAt: tenMinutesAgo } });
    expect(await failRunsOfTheDead(db, engram.services.pubsub)).toBe(2);
    for (const id of [dead.id, old.id]) {
      expect(await db.jobRun.findUniqueOrThrow({ where: { id } })).toMatchObject({ status: "FAILED", error: STOPPED_RUN });
    }
    // The live one is untouched, and ends as it runs.
    expect((await db.jobRun.findFirstOrThrow({ where: { name: "test.alive" } })).status).toBe("RUNNING");
    finish();
    expect((await running).status).toBe("SUCCEEDED");
    const beatAtEnd = await alive();
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await alive()).toBe(beatAtEnd);
  });
});

// A shutdown whose grace runs out leaves the jobs still running to be retried; their runs said
// RUNNING until the 5-minute sweep. They now say at once that the shutdown cut them off.
describe("a job run cut off by this process's shutdown", () => {
  let engram: TestEngram;
  beforeAll(async () => {
    engram = await startTestEngram();
  }, 120_000);
  afterAll(() => engram?.stop());

  it("is marked FAILED, saying so, and a run that finished is left as it ended", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    await recordJobRun(db, engram.services.pubsub, "test.done", async () => ({ status: "SUCCEEDED", result: {} }));
    let started = false;
    void recordJobRun(db, engram.services.pubsub, "test.cut", () => ((started = true), new Promise<never>(() => {}))).catch(() => {});
    await until("the run to start", async () => started, 10_000);
    expect(await failRunsCutOffHere()).toBe(1);
    const { data } = await engram.gql(`{ jobRuns(first: 10) { name status error } }`, {}, engram.tenant.reader);
    expect(data.jobRuns).toEqual(
      expect.arrayContaining([
        { name: "test.cut", status: "FAILED", error: SHUT_DOWN_RUN },
        { name: "test.done", status: "SUCCEEDED", error: null },
      ]),
    );
  });
});

