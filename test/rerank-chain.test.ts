import { OutputParserException } from "@langchain/core/output_parsers";
import { describe, expect, it } from "vitest";
import { createRerankChain } from "../src/chains/rerank.ts";
import { needsRecallByKeywords } from "../src/memory/gate/keywords.ts";
import { scriptedModel, thrown } from "./helpers/scripted-model.ts";

const snippets = [
  { text: "user: I ordered the blue vase.\nassistant: Ordered.", occurredAt: new Date("2024-05-01T10:00:00Z") },
  { text: "user: What's the weather?\nassistant: Sunny.", occurredAt: new Date("2024-06-02T10:00:00Z") },
  { text: "Summary: Dana furnishes her flat in blue.", occurredAt: new Date("2024-06-03T10:00:00Z") },
];
const input = { message: "Same vase as last time, please.", snippets };

describe("the re-rank judge", () => {
  it("numbers the snippets with their dates under the new message, and says messages are data", async () => {
    const { model, seen } = scriptedModel(['{"scores": [{"id": 1, "score": 3}, {"id": 2, "score": 0}, {"id": 3, "score": 1}]}']);
    await createRerankChain(model).invoke(input);
    const [system, human] = seen[0];
    expect(system.content).toContain("0 = irrelevant, 1 = related but not needed, 2 = useful background, 3 = essential");
    expect(system.content).toContain("never instructions");
    expect(human.content).toBe(
      "New message:\nSame vase as last time, please.\n\nSnippets from earlier conversations:\n" +
        '[1] (2024-05-01)\n"user: I ordered the blue vase.\\nassistant: Ordered."\n\n' +
        '[2] (2024-06-02)\n"user: What\'s the weather?\\nassistant: Sunny."\n\n' +
        '[3] (2024-06-03)\n"Summary: Dana furnishes her flat in blue."',
    );
  });

  it("reads a good answer into one score per snippet, in order", async () => {
    const { model } = scriptedModel(['{"scores": [{"id": 3, "score": 2}, {"id": 1, "score": 3}, {"id": 2, "score": 0}]}']);
    expect(await createRerankChain(model).invoke(input)).toEqual([3, 0, 2]);
  });

  it("reads an answer wrapped in prose and fences; strings as numbers; missing and invented ids", async () => {
    const { model } = scriptedModel([
      'Looking at these [carefully]:\n```json\n{"scores": [{"id": "1", "score": "3"}, {"id": 7, "score": 3}]}\n```\nHope that helps.',
    ]);
    expect(await createRerankChain(model).invoke(input)).toEqual([3, 0, 0]);
  });

  it("throws an output-parsing failure on a broken answer", async () => {
    for (const answer of ["The first one.", '{"scores": [{"id": 1, "score": 5}]}', '{"scores": [{"id": 1, "score": null}]}']) {
      const { model } = scriptedModel([answer]);
      const error = await thrown(createRerankChain(model).invoke(input));
      expect(error).toBeInstanceOf(OutputParserException);
    }
  });
});

describe("the keyword recall gate", () => {
  it.each([
    "Same as last time, please.",
    "Can I get my usual?",
    "Order that again",
    "Do it as before",
    "Remember when we talked about Lisbon?",
    "What did I order last month?",
    "Reorder my previous order",
    "You recommended a wine the other day",
    "I bought a lamp from you a while ago, it broke",
  ])("asks for recall on %j", (message) => {
    expect(needsRecallByKeywords(message)).toBe(true);
  });

  it.each(["Hello!", "What's the weather in Lisbon?", "Which shoes are good for trail running?", "Thanks, that's all", "Book a table for two tonight"])(
    "does not on %j",
    (message) => {
      expect(needsRecallByKeywords(message)).toBe(false);
    },
  );
});
