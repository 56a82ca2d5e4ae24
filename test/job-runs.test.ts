import { OutputParserException } from "@langchain/core/output_parsers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { EngramError } from "../src/errors.ts";
import { TimedOut } from "../src/timeout.ts";
import { recordJobRun } from "../src/work/job-runs.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";

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
