import { describe, expect, it } from "vitest";
import { untilItWorks } from "../jobs/backoff.ts";
import { againSoonWhenBusy } from "../jobs/turn.ts";
import { ExtractionBusy } from "../src/work/turn-work.ts";

describe("job retries", () => {
  it("grow for outages, without end", () => {
    const context = (attempt: number) => ({ attempt, error: new Error("connect ECONNREFUSED"), jobName: "memory.turn", jobData: {} });
    expect(untilItWorks(context(1))).toBe(1_000);
    expect(untilItWorks(context(5))).toBe(16_000);
    expect(untilItWorks(context(40))).toBe(300_000);
  });

  it("run the same job again in 2–4 s, not as a failure, while a conversation's extraction runs elsewhere", async () => {
    const delays: number[] = [];
    const control = { runAgainIn: (ms: number) => delays.push(ms) };
    expect(await againSoonWhenBusy(control, Promise.reject(new ExtractionBusy()))).toEqual({ status: "BUSY" });
    expect(delays).toHaveLength(1);
    expect(delays[0]).toBeGreaterThanOrEqual(2_000);
    expect(delays[0]).toBeLessThanOrEqual(4_000);
    await expect(againSoonWhenBusy(control, Promise.reject(new Error("model down")))).rejects.toThrow("model down");
    expect(await againSoonWhenBusy(control, Promise.resolve({ status: "DONE" }))).toEqual({ status: "DONE" });
    expect(delays).toHaveLength(1);
  });
});
