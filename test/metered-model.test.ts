import { AIMessage } from "@langchain/core/messages";
import { FakeListChatModel } from "@langchain/core/utils/testing";
import { describe, expect, it } from "vitest";
import { meteredModel, type ModelUsageRecord } from "../src/models/metered.ts";
import { countTokens } from "../src/memory/tokens.ts";

// A model's answer without usage figures is metered by counting it; the tokenizer's merges in one
// word take time growing with its length squared (300,000 letters: about 60 s), on the event loop
// that answers every request. Users' messages (up to 32,000 characters) are counted the same way.
// No timed assertion (shared machines): 600,000 letters would take minutes before, past the
// test's timeout.
describe("metering a long run of characters without whitespace", () => {
  it("counts it in linear time, as the sum of its pieces", async () => {
    const answer = "x".repeat(600_000);
    const recorded: ModelUsageRecord[] = [];
    const model = meteredModel(new FakeListChatModel({ responses: [answer] }), { chain: "rerank", model: "m" }, {
      deadlineMs: 60_000,
      reserve: async (prompt) => {
        expect(prompt.inputTokens()).toBeGreaterThan(0);
        return undefined;
      },
      record: async (usage) => void recorded.push(usage),
    });
    await model.invoke(`Score this: ${"a".repeat(32_000)}`);
    expect(recorded).toHaveLength(1);
    expect(recorded[0].outputTokens).toBe(600 * countTokens("x".repeat(1_000)));
    // Ordinary text counts as before.
    expect(countTokens("The user is vegetarian.")).toBe(5);
  });
});

// The provider's usage figures are taken as they come, and a tenant may route to its own endpoint:
// negative ones were stored as they were and lowered what the tenant's budget counts as spent, and
// ones past 32 bits failed the usage row's insert after the call was made (so it was retried).
describe("usage figures a provider reports", () => {
  it("are used only when they are whole numbers a usage row holds; otherwise the call is counted", async () => {
    // LangChain's fake, answering "fine" with the usage figures given.
    class ReportingModel extends FakeListChatModel {
      constructor(private readonly usage: { input_tokens: number; output_tokens: number }) {
        super({ responses: ["fine"] });
      }
      override async _generate() {
        const message = new AIMessage({ content: "fine", usage_metadata: { ...this.usage, total_tokens: 0 } });
        return { generations: [{ text: "fine", message }] };
      }
    }
    const answered = (usage: { input_tokens: number; output_tokens: number }) => new ReportingModel(usage);
    const meter = async (model: ReportingModel) => {
      const recorded: ModelUsageRecord[] = [];
      await meteredModel(model, { chain: "summary", model: "m" }, { deadlineMs: 10_000, record: async (usage) => void recorded.push(usage) }).invoke("Hello there");
      return recorded[0];
    };
    expect(await meter(answered({ input_tokens: 12, output_tokens: 3 }))).toMatchObject({ inputTokens: 12, outputTokens: 3 });
    for (const usage of [{ input_tokens: -1_000_000, output_tokens: -5 }, { input_tokens: 2 ** 40, output_tokens: 1.5 }]) {
      const recorded = await meter(answered(usage));
      expect(recorded.inputTokens, JSON.stringify(usage)).toBe(countTokens("Hello there"));
      expect(recorded.outputTokens, JSON.stringify(usage)).toBe(countTokens("fine"));
    }
  });
});
