import { describe, expect, it } from "vitest";
import { untilItWorks } from "../jobs/backoff.ts";
import { ExtractionBusy } from "../src/work/turn-work.ts";

const context = (attempt: number, error: Error) => ({ attempt, error, jobName: "memory.turn", jobData: {} });

describe("job retries", () => {
  it("grow for outages, without end", () => {
    const outage = new Error("connect ECONNREFUSED 127.0.0.1:1");
    expect(untilItWorks(context(1, outage))).toBe(1_000);
    expect(untilItWorks(context(5, outage))).toBe(16_000);
    expect(untilItWorks(context(40, outage))).toBe(300_000);
  });

  it("stay at 2–4 s while a conversation's extraction runs elsewhere, however often it was busy", () => {
    for (const attempt of [1, 10, 40]) {
      const delay = untilItWorks(context(attempt, new ExtractionBusy()))!;
      expect(delay).toBeGreaterThanOrEqual(2_000);
      expect(delay).toBeLessThanOrEqual(4_000);
    }
  });
});
