import type { ServerResponse } from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { runTurnFollowUps } from "../src/work/follow-ups.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import { stallAfterHeaders, startLoopbackProvider, timed, type LoopbackProvider } from "./helpers/loopback-provider.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { CONTEXT, RECALL, say } from "./helpers/recall.ts";
import { until } from "./helpers/until.ts";

// A request waits on a model for ENGRAM_REPLY_MODEL_TIMEOUT_MS at most, not for a job's deadline:
// here a job's call may take (1 + 1) × 30 s + 2 s, a reply's 1 s. Before, `context` and `recall`
// waited on a stalled provider for the job's whole deadline (about 186 s with the defaults).

const UPDATE = `mutation($input: UpdateTenantSettingsInput!) { updateTenantSettings(input: $input) { modelRouting { cheap { baseUrl } } } }`;
const REPLY_MS = 1_000;

/** An OpenAI chat completion whose content is `content`. */
function chatCompletion(res: ServerResponse, content: string) {
  res.writeHead(200, { "content-type": "application/json" });
  res.end(
    JSON.stringify({
      id: "slow",
      object: "chat.completion",
      created: 0,
      model: "slow",
      choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }],
      usage: { prompt_tokens: 10, completion_tokens: 2, total_tokens: 12 },
    }),
  );
}

let model: ModelServer;
let engram: TestEngram;
let stalling: LoopbackProvider;
let slow: LoopbackProvider;

beforeAll(async () => {
  stalling = await startLoopbackProvider(stallAfterHeaders);
  // Answers every chat call, after twice the reply's deadline and well within a job's.
  slow = await startLoopbackProvider((res) => {
    const late = setTimeout(() => chatCompletion(res, '{"scores":[]}'), 2 * REPLY_MS);
    res.on("close", () => clearTimeout(late));
  });
  ({ model, engram } = await startEngramWithModel({
    env: {
      ENGRAM_EMBEDDINGS: "openai",
      ENGRAM_MODEL_TIMEOUT_MS: "30000",
      ENGRAM_MODEL_MAX_RETRIES: "1",
      ENGRAM_REPLY_MODEL_TIMEOUT_MS: String(REPLY_MS),
      ENGRAM_MODEL_HOST_ALLOWLIST: `${stalling.host},${slow.host}`,
    },
  }));
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
  await stalling?.stop();
  await slow?.stop();
});

const tenantId = () => engram.tenant.tenantId;
async function route(routing: Record<string, { baseUrl: string; model?: string } | null>) {
  const { errors } = await engram.gql(UPDATE, { input: { modelRouting: routing } });
  expect(errors).toBeUndefined();
}

/** A turn in one conversation, its snippet written and embedded now (this test runs no worker). */
async function remembered(user: string, conversation: string, message: string) {
  const turn = await say(engram, { user, conversation }, message, "Noted.");
  await runTurnFollowUps(forTenant(engram.services.db, tenantId()), engram.services.deps);
  return turn;
}

/** The context for a message whose caller says it needs recall (so the re-rank judge is asked). */
const contextNeedingRecall = (conversationId: string, message: string) =>
  engram.gql(CONTEXT, { input: { conversationId, message, gate: { remember: false, forget: "NONE", needsRecall: true } } });

describe("a request's model calls end at the reply's deadline", () => {
  it("recall answers from keywords when the query embedding stalls, and the stalled request is torn down", async () => {
    await route({ cheap: null, embedding: null });
    const { endUserId } = await remembered("rae", "bees", "I keep bees on the roof of the garage.");
    await route({ embedding: { baseUrl: stalling.url, model: "stalled-embed" } });
    const before = stalling.hits();
    const { value, error } = await timed(engram.gql(RECALL, { input: { endUserId, text: "bees on the roof" } }));
    expect(error).toBeNull();
    expect(value!.errors).toBeUndefined();
    expect(value!.data.recall.degraded).toMatch(/vector search unavailable: model provider did not answer in time \(1000 ms for the reply, ENGRAM_REPLY_MODEL_TIMEOUT_MS\)/);
    expect(value!.data.recall.candidates.map((c: { text: string }) => c.text).join()).toContain("bees on the roof");
    expect(stalling.hits()).toBeGreaterThan(before);
    await until("the stalled embedding request to close", async () => stalling.open() === 0, 5_000);
  });

  it("context answers with the fused choice when the re-rank judge stalls", async () => {
    await route({ cheap: null, embedding: null });
    const { conversationId } = await remembered("sol", "boat", "My sailing boat is called the Heron and she is moored in Kinsale.");
    const next = await say(engram, { user: "sol", conversation: "boat-later" }, "Hello again.", "Hi!");
    await route({ cheap: { baseUrl: stalling.url } });
    const before = stalling.hits();
    const { value, error } = await timed(contextNeedingRecall(next.conversationId, "Where is my sailing boat the Heron moored?"));
    expect(error).toBeNull();
    expect(value!.errors).toBeUndefined();
    expect(stalling.hits()).toBeGreaterThan(before); // the judge was asked
    const recall = value!.data.context.blocks.find((b: { kind: string }) => b.kind === "RECALL");
    expect(recall?.text).toContain("Kinsale");
    expect(conversationId).not.toBe(next.conversationId);
    await until("the stalled re-rank request to close", async () => stalling.open() === 0, 5_000);
  });

  it("gives a request's model calls one deadline together: a judge after a stalled embedding is not sent", async () => {
    await route({ cheap: null, embedding: null });
    await remembered("ivo", "oars", "I restore wooden oars in my workshop in Bergen.");
    const next = await say(engram, { user: "ivo", conversation: "oars-later" }, "Hi.", "Hello!");
    // Both the query's embedding and the re-rank judge go to the provider that never answers.
    await route({ cheap: { baseUrl: stalling.url }, embedding: { baseUrl: stalling.url, model: "stalled-embed" } });
    const before = stalling.hits();
    const { value, error } = await timed(contextNeedingRecall(next.conversationId, "Where is my workshop for the wooden oars?"));
    expect(error).toBeNull();
    expect(value!.errors).toBeUndefined();
    // The embedding spent the reply's second; the judge was never sent (before, it waited a second of its own).
    expect(stalling.hits() - before).toBe(1);
    expect(value!.data.context.degraded.join(" | ")).toMatch(/vector search unavailable: model provider did not answer in time.*recall judge unavailable/);
    expect(value!.data.context.blocks.find((b: { kind: string }) => b.kind === "RECALL")?.text).toContain("Bergen");
    await until("the stalled embedding request to close", async () => stalling.open() === 0, 5_000);
  });

  it("leaves a job's calls their own deadline: a slow answer is waited for there, not in a reply", async () => {
    await route({ cheap: { baseUrl: slow.url }, embedding: null });
    // The worker's view of the models: the answer after 2 s is taken.
    const chat = await engram.services.models.chat(tenantId(), "cheap", "rerank");
    const job = await timed(chat!.invoke("hello"));
    expect(job.error).toBeNull();
    // A request's view: the same provider is past the reply's deadline, and the context goes on without it.
    await remembered("uma", "kiln", "I fire my pottery in a wood kiln every spring.");
    const next = await say(engram, { user: "uma", conversation: "kiln-later" }, "Hi.", "Hello!");
    const before = slow.hits();
    const { value, error } = await timed(contextNeedingRecall(next.conversationId, "When do I fire my pottery in the wood kiln?"));
    expect(error).toBeNull();
    expect(value!.errors).toBeUndefined();
    expect(slow.hits()).toBeGreaterThan(before);
    expect(value!.data.context.blocks.find((b: { kind: string }) => b.kind === "RECALL")?.text).toContain("wood kiln");
    await until("the abandoned re-rank request to close", async () => slow.open() === 0, 5_000);
  });
});
