import { FakeListChatModel } from "@langchain/core/utils/testing";
import { describe, expect, it } from "vitest";
import { meteredModel, type ModelUsageRecord } from "../src/models/metered.ts";
import { countTokens } from "../src/memory/tokens.ts";

// A model's answer without usage figures is metered by counting it; the tokenizer's merges in one
// word take time growing with its length squared (300,000 letters: about 60 s), on the event loop
// that answers every request. Users' messages (up to 32,000 characters) are counted the same way.
describe("metering a long run of characters without whitespace", () => {
  it("counts it in linear time, as the sum of its pieces", async () => {
    const answer = "x".repeat(300_000);
    const recorded: ModelUsageRecord[] = [];
    const model = meteredModel(new FakeListChatModel({ responses: [answer] }), { chain: "rerank", model: "m" }, {
      deadlineMs: 60_000,
      reserve: async (prompt) => {
        expect(prompt.inputTokens()).toBeGreaterThan(0);
        return undefined;
      },
      record: async (usage) => void recorded.push(usage),
    });
    const started = performance.now();
    await model.invoke(`Score this: ${"a".repeat(32_000)}`);
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(recorded).toHaveLength(1);
    expect(recorded[0].outputTokens).toBe(300 * countTokens("x".repeat(1_000)));
    // Ordinary text counts as before.
    expect(countTokens("The user is vegetarian.")).toBe(5);
  });
});
