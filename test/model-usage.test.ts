import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTenantWithKeys, startTestEngram, type TestEngram } from "./helpers/engram.ts";

// A tenant's whole history of model usage passes 2^31 tokens: GraphQL's Int is 32 bits.

let engram: TestEngram;
beforeAll(async () => {
  engram = await startTestEngram();
});
afterAll(() => engram?.stop());

const USAGE = `{
  modelUsage(groupBy: [MODEL]) { calls inputTokens outputTokens redactions unpricedTokens rows { model calls inputTokens outputTokens unpricedTokens } }
  budgetStatus { spent }
}`;

describe("usage totals past 32 bits", () => {
  it("answers them exactly, in modelUsage and in the budget's spent", async () => {
    const tenant = await createTenantWithKeys(engram.services, "heavy-usage");
    // The most one usage row holds (its columns are 32-bit), three times over, and odd sums.
    const most = 2 ** 31 - 1;
    await engram.services.db.modelUsage.createMany({
      data: [0, 1, 2].map((i) => ({
        tenantId: tenant.tenantId,
        purpose: "memory:big-m",
        chain: "summary",
        model: "big-m",
        inputTokens: most,
        outputTokens: 1_000_000_001 + i,
        redactions: most,
      })),
    });
    const input = 3 * most;
    const output = 3_000_000_006;
    expect(input).toBe(6_442_450_941);

    const { data, errors } = await engram.gql(USAGE, {}, tenant.reader);
    expect(errors).toBeUndefined();
    expect(data.modelUsage).toEqual({
      calls: 3,
      inputTokens: input,
      outputTokens: output,
      redactions: input,
      unpricedTokens: input + output,
      rows: [{ model: "big-m", calls: 3, inputTokens: input, outputTokens: output, unpricedTokens: input + output }],
    });
    expect(data.budgetStatus.spent).toBe(input + output);
  });
});
