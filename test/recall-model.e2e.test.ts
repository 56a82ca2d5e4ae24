import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import { bagOfWords } from "./helpers/fake-embeddings.ts";
import type { ChatRequest, ModelServer } from "./helpers/model-server.ts";
import { allIndexed, CONTEXT, say } from "./helpers/recall.ts";
import { rerankSnippets } from "./helpers/scripted-memory-model.ts";

// Recall through the real OpenAI clients against a scripted OpenAI-compatible server: embeddings
// from /v1/embeddings, the re-rank judge from /v1/chat/completions.
let model: ModelServer;
let engram: TestEngram;

const isRerank = (r: ChatRequest) => r.chain === "rerank";

beforeAll(async () => {
  ({ model, engram } = await startEngramWithModel({
    worker: true,
    embed: (input) => input.map((text) => bagOfWords(text)),
    env: { ENGRAM_EMBEDDING_MODEL: "scripted-embed" },
  }));
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

describe("recall on a scripted OpenAI-compatible server", () => {
  it("embeds through /v1/embeddings, lets the judge choose at most 3 scoring 2+, and accounts the judge", async () => {
    const user = "dana";
    const orders = ["blue ceramic vase", "blue linen tablecloth", "blue glass bowl", "blue wool blanket", "green garden hose"];
    for (const [i, item] of orders.entries()) {
      await say(engram, { user, conversation: `d-${i}` }, `Please order the ${item} for the house.`, `Ordered the ${item}.`);
    }
    await allIndexed(engram);
    const snippet = await engram.services.db.recallSnippet.findFirstOrThrow({ where: { tenantId: engram.tenant.tenantId } });
    expect(snippet.embeddingModel).toBe("scripted-embed");
    // (LangChain's OpenAIEmbeddings sends newlines as spaces.)
    expect(model.embeddingRequests.flat()).toContain(snippet.text.replace(/\n/g, " "));

    // The judge: 3 for the vase, 2 for the other blue things, 0 for the rest; wrapped in prose.
    model.respond((request) => {
      if (!isRerank(request)) return "{}";
      const scores = rerankSnippets(request).map(({ id, text }) => ({
        id,
        score: text.includes("vase") ? 3 : text.includes("blue") ? 2 : 0,
      }));
      return `Sure, here are my scores:\n\`\`\`json\n${JSON.stringify({ scores })}\n\`\`\``;
    });
    const now = await say(engram, { user, conversation: "d-now" }, "Hi!", "Hello Dana.");
    const embedsBefore = model.embeddingRequests.length;
    const { data, errors } = await engram.gql(CONTEXT, {
      input: { conversationId: now.conversationId, message: "Order the same blue vase as last time, please." },
    });
    expect(errors).toBeUndefined();
    const recall = data.context.blocks.find((b: any) => b.kind === "RECALL");
    expect(recall.items).toHaveLength(3);
    expect(recall.items[0]).toMatchObject({ score: 3 });
    expect(recall.items[0].text).toContain("blue ceramic vase");
    expect(recall.items.slice(1).every((i: any) => i.score === 2 && i.text.includes("blue"))).toBe(true);
    expect(recall.text).not.toContain("garden hose");
    // One embedding for the message (the new turn's own indexing may add one more).
    expect(model.embeddingRequests.slice(embedsBefore).filter((r) => r.includes("Order the same blue vase as last time, please."))).toHaveLength(1);

    const judged = model.requests.filter(isRerank);
    expect(judged).toHaveLength(1);
    const listed = rerankSnippets(judged[0]);
    expect(listed.length).toBe(5);
    expect(judged[0].messages[1].content).toMatch(/^New message:\n"Order the same blue vase as last time, please\."\n\nSnippets from earlier conversations:\n\[1\] \(\d{4}-\d\d-\d\d\)\n"user: Please order/);
    // The current conversation is never offered to the judge.
    expect(judged[0].messages[1].content).not.toContain("Hello Dana");

    const usage = await engram.gql(`{ modelUsage { rows { chain purpose calls } } }`);
    expect(usage.data.modelUsage.rows.find((r: any) => r.chain === "rerank")).toMatchObject({ purpose: "memory:gpt-4o-mini", calls: 1 });
  });

  it("shows the judge each candidate with the turns around it, and up to 30 candidates", async () => {
    const user = "omar";
    // One conversation of three turns: the middle one names the trip, the next says where.
    for (const [q, a] of [
      ["Morning! Busy week at work.", "Sounds like a lot."],
      ["I'm planning our family holiday trip.", "Nice, where to?"],
      ["We settled on Lisbon in June.", "Lisbon in June is lovely."],
    ]) {
      await say(engram, { user, conversation: "o-trip" }, q, a);
    }
    for (let i = 0; i < 32; i++) await say(engram, { user, conversation: `o-other-${i}` }, `Order ${i} holiday cards, please.`, "Done.");
    await allIndexed(engram);
    model.respond((request) => (isRerank(request) ? JSON.stringify({ scores: [{ id: 1, score: 3 }] }) : "{}"));
    const before = model.requests.filter(isRerank).length;
    const now = await say(engram, { user, conversation: "o-now" }, "Hi", "Hello Omar.");
    await engram.gql(CONTEXT, { input: { conversationId: now.conversationId, message: "Remind me about our holiday trip from last time?" } });
    const judged = model.requests.filter(isRerank).slice(before);
    expect(judged).toHaveLength(1);
    const human = judged[0].messages[1].content;
    expect(human.match(/^\[\d+\] \(/gm)).toHaveLength(30);
    expect(human).toContain(
      `(just before: ${JSON.stringify("user: Morning! Busy week at work. / assistant: Sounds like a lot.")})\n${JSON.stringify("user: I'm planning our family holiday trip.\nassistant: Nice, where to?")}\n(just after: ${JSON.stringify("user: We settled on Lisbon in June. / assistant: Lisbon in June is lovely.")})`,
    );
    // A neighbouring message forgotten while the tenant keeps raw messages is not shown to the judge.
    await engram.services.db.message.updateMany({ where: { content: "Morning! Busy week at work." }, data: { forgottenAt: new Date() } });
    await engram.gql(CONTEXT, { input: { conversationId: now.conversationId, message: "Remind me about our holiday trip from last time?" } });
    const again = model.requests.filter(isRerank).at(-1)!.messages[1].content;
    expect(again).toContain(`(just before: ${JSON.stringify("assistant: Sounds like a lot.")})`);
    // Nor one kept after a fact read from it was deleted (deleteFact marks it).
    await engram.services.db.message.updateMany({ where: { content: "Sounds like a lot." }, data: { factsForgottenAt: new Date() } });
    await engram.gql(CONTEXT, { input: { conversationId: now.conversationId, message: "Remind me about our holiday trip from last time?" } });
    const third = model.requests.filter(isRerank).at(-1)!.messages[1].content;
    // (Its own snippet is still a candidate here: deleteFact would have deleted it.)
    expect(third).not.toContain(`(just before: ${JSON.stringify("assistant: Sounds like a lot.")})`);
    expect(third).toMatch(/\[\d+\] \(\d{4}-\d\d-\d\d\)\n"user: I'm planning our family holiday trip\./);
  });

  it("falls back to the similarity floor when the judge's answer is broken", async () => {
    model.respond((request) => (isRerank(request) ? "I think the first one is best." : "{}"));
    const now = await say(engram, { user: "dana", conversation: "d-broken" }, "Hi again", "Hello.");
    const { data } = await engram.gql(CONTEXT, {
      input: { conversationId: now.conversationId, message: "Order the same blue vase as last time, please." },
    });
    const recall = data.context.blocks.find((b: any) => b.kind === "RECALL");
    expect(recall.items.length).toBeGreaterThan(0);
    expect(recall.items.length).toBeLessThanOrEqual(3);
    expect(recall.items.every((i: any) => i.score === null)).toBe(true);
    expect(recall.items[0].text).toContain("vase");
    // And the answer says so: the floor chose, not the judge.
    expect(data.context.degraded).toEqual(["recall judge unavailable: the model's answer could not be read; the similarity floor chose instead"]);
  });

  it("answers without recall when the embeddings endpoint is down", async () => {
    model.embed(() => ({ status: 503 }));
    model.respond((request) => (isRerank(request) ? JSON.stringify({ scores: [] }) : "{}"));
    const now = await say(engram, { user: "dana", conversation: "d-down" }, "Hey", "Hello.");
    const { data, errors } = await engram.gql(CONTEXT, {
      input: { conversationId: now.conversationId, message: "Order the same blue vase as last time, please." },
    });
    expect(errors).toBeUndefined();
    expect(data.context.blocks.map((b: any) => b.kind)).toContain("TAIL");
    model.embed((input) => input.map((text) => bagOfWords(text)));
  });
});
