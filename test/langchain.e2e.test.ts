import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AIMessage, type BaseMessage } from "@langchain/core/messages";
import { ChatPromptTemplate, MessagesPlaceholder } from "@langchain/core/prompts";
import { RunnableLambda, RunnableWithMessageHistory } from "@langchain/core/runnables";
import { FakeListChatModel } from "@langchain/core/utils/testing";
import { EngramClient } from "engram/client";
import { EngramChatMessageHistory, EngramRetriever, gateVerdictFromToolCall, withEngramMemory } from "engram/langchain";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { startFlakyProxy } from "./helpers/flaky-proxy.ts";
import { allIndexed, INDEXING_TIMEOUT_MS } from "./helpers/recall.ts";

// LangChain.js memory backed by a real Engram over HTTP, driven by LangChain's fake chat model.
let engram: TestEngram;
let client: EngramClient;
let url: string;

beforeAll(async () => {
  engram = await startTestEngram({ worker: true });
  url = await engram.listen();
  client = new EngramClient({ url, apiKey: engram.tenant.writer });
});
afterAll(() => engram?.stop());

/** A fake chat model that answers from a script and keeps the messages of each call. */
function fakeModel(responses: string[]) {
  const model = new FakeListChatModel({ responses });
  const prompts: BaseMessage[][] = [];
  const callbacks = [{ handleChatModelStart: (_llm: unknown, messages: BaseMessage[][]) => void prompts.push(messages[0]) }];
  return { model: model.withConfig({ callbacks }), prompts };
}

const turnsOf = async (externalId: string) =>
  engram.services.db.turn.count({ where: { conversation: { externalId, tenantId: engram.tenant.tenantId } } });

describe("EngramChatMessageHistory", () => {
  it("records each exchange of RunnableWithMessageHistory as a turn, and reads them back", async () => {
    const { model } = fakeModel(["Hi Ana!", "Size 42, noted."]);
    const prompt = ChatPromptTemplate.fromMessages([new MessagesPlaceholder("history"), ["human", "{question}"]]);
    const chain = new RunnableWithMessageHistory({
      runnable: prompt.pipe(model),
      getMessageHistory: (sessionId: string) => new EngramChatMessageHistory({ client, agent: "shop", endUser: "ana", conversation: sessionId }),
      inputMessagesKey: "question",
      historyMessagesKey: "history",
    });
    const config = { configurable: { sessionId: "ana-history" } };
    await chain.invoke({ question: "Hello, I am Ana." }, config);
    await chain.invoke({ question: "My shoe size is 42." }, config);

    expect(await turnsOf("ana-history")).toBe(2);
    const history = new EngramChatMessageHistory({ client, agent: "shop", endUser: "ana", conversation: "ana-history" });
    const messages = await history.getMessages();
    expect(messages.map((m) => [m.getType(), m.text])).toEqual([
      ["human", "Hello, I am Ana."],
      ["ai", "Hi Ana!"],
      ["human", "My shoe size is 42."],
      ["ai", "Size 42, noted."],
    ]);
    await history.clear();
    expect(await history.getMessages()).toEqual([]);
  });

  it("records an AI message with no text (a tool call alone) as a turn with no reply, and keeps a human message whose write failed", async () => {
    const history = new EngramChatMessageHistory({ client, agent: "shop", endUser: "ana", conversation: "ana-tools" });
    await history.addUserMessage("Check my order status.");
    await history.addMessage(new AIMessage({ content: "", tool_calls: [{ name: "order_status", args: {}, id: "call-1", type: "tool_call" }] }));
    expect((await history.getMessages()).map((m) => [m.getType(), m.text])).toEqual([["human", "Check my order status."]]);
    // A write refused (a reply over the limit): the human message is still there for the next try.
    await history.addUserMessage("And the invoice?");
    await expect(history.addAIMessage("x".repeat(32_001))).rejects.toMatchObject({ code: "BAD_USER_INPUT" });
    expect((await history.getMessages()).map((m) => m.text).at(-1)).toBe("And the invoice?");
    await history.addAIMessage("Sent.");
    expect(await turnsOf("ana-tools")).toBe(2);
  });

  it("records a turn once when its write is tried again after a lost answer", async () => {
    const proxy = await startFlakyProxy(url);
    try {
      const flaky = new EngramClient({ url: proxy.url, apiKey: engram.tenant.writer, retries: 0 });
      const history = new EngramChatMessageHistory({ client: flaky, agent: "shop", endUser: "ana", conversation: "ana-lost" });
      await history.addUserMessage("Is my parcel on its way?");
      proxy.fail("drop-answer");
      await expect(history.addAIMessage("Yes, it left today.")).rejects.toMatchObject({ code: "NETWORK_ERROR" });
      // The turn was stored, its answer lost; the same write again is the same turn.
      await history.addAIMessage("Yes, it left today.");
      expect(await turnsOf("ana-lost")).toBe(1);
    } finally {
      await proxy.stop();
    }
  });

  it("refuses an AI message with no human message before it", async () => {
    const history = new EngramChatMessageHistory({ client, agent: "shop", endUser: "ana", conversation: "ana-orphan" });
    await expect(history.addAIMessage("Hello?")).rejects.toMatchObject({ code: "BAD_USER_INPUT" });
  });
});

describe("withEngramMemory", () => {
  it("hands Engram the gate verdict the model gave as a tool call; Engram stores it as the turn's verdict", async () => {
    const { toolName, jsonSchema } = await client.gateInstructions();
    expect(toolName).toBe("engram_gate");
    expect(jsonSchema).toMatchObject({ required: expect.arrayContaining(["needsRecall"]) });
    const verdict = { remember: true, forget: "NONE" as const, forgetTargets: [], needsRecall: false };
    // A model bound with the gate as a tool answers with text and that tool call (LangChain's fake
    // chat models drop tool calls, so a runnable stands in for the bound model).
    const model = RunnableLambda.from(
      async () => new AIMessage({ content: "Welcome, Kim!", tool_calls: [{ name: toolName, args: verdict, id: "call-1", type: "tool_call" }] }),
    );
    const chat = withEngramMemory(model, { client, agent: "shop", endUser: "kim", conversation: "kim-1", gateVerdict: gateVerdictFromToolCall });
    expect((await chat.invoke("I am Kim and I only wear black.")).text).toBe("Welcome, Kim!");
    const conversation = await engram.services.db.conversation.findFirstOrThrow({ where: { externalId: "kim-1", tenantId: engram.tenant.tenantId } });
    expect(await engram.services.db.gateVerdict.findMany({ where: { conversationId: conversation.id } })).toMatchObject([
      { decidedBy: "CALLER", remember: true, needsRecall: false },
    ]);
  });

  it("records a turn whose answer is a tool call with no text", async () => {
    const { toolName } = await client.gateInstructions();
    const verdict = { remember: false, forget: "NONE" as const, forgetTargets: [], needsRecall: false };
    const model = RunnableLambda.from(async () => new AIMessage({ content: "", tool_calls: [{ name: toolName, args: verdict, id: "call-2", type: "tool_call" }] }));
    const chat = withEngramMemory(model, { client, agent: "shop", endUser: "kim", conversation: "kim-2", gateVerdict: gateVerdictFromToolCall });
    expect((await chat.invoke("Just checking in.")).tool_calls).toHaveLength(1);
    expect(await turnsOf("kim-2")).toBe(1);
  });

  it("puts Engram's context in the prompt before the call and records the turn after it", async () => {
    const { model, prompts } = fakeModel(["Noted: blue trail runners.", "You ordered the blue trail runners."]);
    const memory = { client, agent: "shop", endUser: "bo", conversation: "bo-1" };
    const chat = withEngramMemory(model, { ...memory, system: "You are a shop assistant." });

    const first = await chat.invoke("I ordered the blue trail running shoes.");
    expect(first.text).toBe("Noted: blue trail runners.");
    // First turn: nothing to remember yet, only the agent's own instructions.
    expect(prompts[0].map((m) => m.getType())).toEqual(["system", "human"]);
    expect(prompts[0][0].text).toBe("You are a shop assistant.");

    const conversation = (await client.conversation("bo-1"))!;
    await client.addFact({ endUserId: conversation.endUser.id, text: "Bo runs trail races every month." });
    await chat.invoke("Which shoes did I order?");
    const system = prompts[1][0].text;
    expect(system).toContain("You are a shop assistant.");
    expect(system).toContain("Bo runs trail races every month."); // the facts block
    expect(system).toContain("I ordered the blue trail running shoes."); // the tail
    expect(prompts[1][1].text).toBe("Which shoes did I order?");

    const stored = (await client.conversation("bo-1"))!.messages.edges.map((e) => e.node.content);
    expect(stored).toEqual([
      "I ordered the blue trail running shoes.",
      "Noted: blue trail runners.",
      "Which shoes did I order?",
      "You ordered the blue trail runners.",
    ]);
  });

  it("hands the memory to a prompt template as {memory}", async () => {
    const { model, prompts } = fakeModel(["First.", "Second."]);
    const prompt = ChatPromptTemplate.fromMessages([
      ["system", "Tone: {tone}\nMemory:\n{memory}"],
      ["human", "{input}"],
    ]);
    const chain = withEngramMemory(prompt.pipe(model), { client, agent: "shop", endUser: "cy", conversation: "cy-1" });
    await chain.invoke({ input: "My order number is 5521.", tone: "brief" });
    await chain.invoke({ input: "What is my order number?", tone: "brief" });
    expect(prompts[1][0].text).toMatch(/^Tone: brief\nMemory:\n/);
    expect(prompts[1][0].text).toContain("My order number is 5521.");
    expect(await turnsOf("cy-1")).toBe(2);
  });
});

describe("EngramRetriever", () => {
  it("returns the user's earlier conversations as Documents, never the current one", async () => {
    await client.recordTurn({
      agentExternalId: "shop",
      endUserExternalId: "dee",
      conversationExternalId: "dee-old",
      userMessage: "Please ship the kayak paddles to my office in Lisbon.",
      assistantMessage: "The kayak paddles ship to your Lisbon office.",
    });
    await client.recordTurn({
      agentExternalId: "shop",
      endUserExternalId: "dee",
      conversationExternalId: "dee-now",
      userMessage: "Where did the kayak paddles go?",
    });
    await allIndexed(engram, undefined, INDEXING_TIMEOUT_MS);
    const retriever = new EngramRetriever({ client, conversation: "dee-now", k: 3 });
    const documents = await retriever.invoke("Where were my kayak paddles shipped?");
    expect(documents[0].pageContent).toContain("Lisbon office");
    expect(documents[0].metadata).toMatchObject({ source: "engram", kind: "TURN" });
    const current = (await client.conversation("dee-now"))!.id;
    expect(documents.every((d) => d.metadata.conversationId !== current)).toBe(true);
    expect(await new EngramRetriever({ client, conversation: "never-recorded" }).invoke("kayak")).toEqual([]);

    // By the user's own id: all of their conversations.
    const byUser = await new EngramRetriever({ client, endUser: "dee", k: 5 }).invoke("kayak paddles");
    expect(new Set(byUser.map((d) => d.metadata.conversationId))).toEqual(new Set([current, documents[0].metadata.conversationId]));
    expect(await new EngramRetriever({ client, endUser: "nobody" }).invoke("kayak")).toEqual([]);
  }, INDEXING_TIMEOUT_MS + 60_000);
});
