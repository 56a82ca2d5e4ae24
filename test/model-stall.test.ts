import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { budgetStatus } from "../src/governance/budget.ts";
import { countTokens } from "../src/memory/tokens.ts";
import { ModelCallError } from "../src/models/egress.ts";
import { runTurnFollowUps } from "../src/work/follow-ups.ts";
import { runSummarize } from "../src/work/summarize.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import { stallAfterHeaders, startLoopbackProvider, timed, type LoopbackProvider } from "./helpers/loopback-provider.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { RECALL, say } from "./helpers/recall.ts";
import { until } from "./helpers/until.ts";

// A model provider that sends its headers and then stalls, or trickles its body a byte at a
// time: the OpenAI client's timeout stops at the headers, so before the fix such a call held its
// caller (a job and its conversation lease, the shared follow-ups job, a context request) for ever.

const UPDATE = `mutation($input: UpdateTenantSettingsInput!) { updateTenantSettings(input: $input) { modelRouting { cheap { baseUrl } } } }`;

function expectOutage(error: unknown, reason: RegExp) {
  expect(error).toBeInstanceOf(ModelCallError);
  expect((error as ModelCallError).code).toBe("MODEL_UNAVAILABLE");
  expect((error as ModelCallError).kind).toBe("failed");
  expect((error as ModelCallError).message).toMatch(reason);
}

let model: ModelServer;
let engram: TestEngram;
let stalling: LoopbackProvider;
let trickling: LoopbackProvider;
/** Stalls on every other request, and answers the next. */
let stallingOnce: LoopbackProvider;

beforeAll(async () => {
  stalling = await startLoopbackProvider(stallAfterHeaders);
  trickling = await startLoopbackProvider((res) => {
    stallAfterHeaders(res);
    // Never idle for as long as the timeout: only the call's overall deadline can end it.
    const drip = setInterval(() => res.write(" "), 100);
    res.on("close", () => clearInterval(drip));
  });
  stallingOnce = await startLoopbackProvider((res) => {
    if (stallingOnce.hits() % 2 === 1) return stallAfterHeaders(res);
    res.writeHead(200, { "content-type": "application/json" }).end(
      JSON.stringify({
        id: "late",
        object: "chat.completion",
        created: 0,
        model: "late",
        choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }],
        usage: { prompt_tokens: 7, completion_tokens: 1, total_tokens: 8 },
      }),
    );
  });
  ({ model, engram } = await startEngramWithModel({
    respond: () => "{}",
    embed: (input) => input.map(() => [0.1, 0.2, 0.3]),
    env: {
      ENGRAM_EMBEDDINGS: "openai",
      ENGRAM_MODEL_TIMEOUT_MS: "500",
      ENGRAM_MODEL_MAX_RETRIES: "1",
      ENGRAM_MODEL_HOST_ALLOWLIST: `${stalling.host},${trickling.host},${stallingOnce.host}`,
    },
  }));
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
  await stalling?.stop();
  await trickling?.stop();
  await stallingOnce?.stop();
});

const tenantId = () => engram.tenant.tenantId;
async function route(routing: Record<string, { baseUrl: string; model?: string } | null>) {
  const { errors } = await engram.gql(UPDATE, { input: { modelRouting: routing } });
  expect(errors).toBeUndefined();
}

describe("a provider that stalls after its headers", () => {
  it("fails a chat call as an outage, after its retry, and frees the connection", async () => {
    await route({ cheap: { baseUrl: stalling.url } });
    const chat = await engram.services.models.chat(tenantId(), "cheap", "summary");
    const before = stalling.hits();
    const { error } = await timed(chat!.invoke("hello"));
    expectOutage(error, /stalled|did not answer in time/);
    expect(stalling.hits() - before).toBe(2); // the retry is kept
    await until("the stalled connections to close", async () => stalling.open() === 0, 5_000);
  });

  it("fails an embedding call on the tenant's embedding route the same way", async () => {
    await route({ embedding: { baseUrl: stalling.url, model: "stalled-embed" } });
    const embeddings = await engram.services.models.embeddings(tenantId());
    const { error } = await timed(embeddings!.embedDocuments(["a text to embed"]));
    expectOutage(error, /stalled|did not answer in time/);
    await until("the stalled connections to close", async () => stalling.open() === 0, 5_000);
  });

  it("lets a summary rewrite end and give its conversation's lease back", async () => {
    await route({ cheap: { baseUrl: stalling.url }, embedding: null });
    let turn!: Awaited<ReturnType<typeof say>>;
    for (let n = 0; n < 4; n++) turn = await say(engram, { user: "sam", conversation: "stalled-summary" }, `Message ${n} about the garden.`, "Noted.");
    const { error } = await timed(runSummarize(forTenant(engram.services.db, tenantId()), engram.services.deps, { tenantId: tenantId(), conversationId: turn.conversationId }));
    expectOutage(error, /stalled|did not answer in time/);
    const conversation = await engram.services.db.conversation.findUniqueOrThrow({ where: { id: turn.conversationId } });
    expect(conversation.summaryLeaseUntil).toBeNull();
  });

  it("lets the follow-ups job end, its embeddings left to an index job", async () => {
    await route({ cheap: null, embedding: { baseUrl: stalling.url, model: "stalled-embed" } });
    await say(engram, { user: "sam", conversation: "stalled-follow-ups" }, "I planted tomatoes today.", "Nice.");
    const db = forTenant(engram.services.db, tenantId());
    const { error } = await timed(runTurnFollowUps(db, engram.services.deps));
    expect(error).toBeNull();
    const queued = await engram.services.db.$queryRaw<{ n: number }[]>`
      SELECT count(*)::int AS "n" FROM "agenda_jobs" WHERE "name" = 'recall.index' AND "data"->>'tenantId' = ${tenantId()}`;
    expect(queued[0].n).toBeGreaterThan(0);
  });

  it("answers recall from keywords, saying why vector search was skipped", async () => {
    await route({ embedding: { baseUrl: stalling.url, model: "stalled-embed" } });
    const { endUserId } = await say(engram, { user: "sam", conversation: "stalled-recall" }, "I keep bees on the roof.", "Lovely.");
    const { data, errors } = await engram.gql(RECALL, { input: { endUserId, text: "bees on the roof" } });
    expect(errors).toBeUndefined();
    expect(data.recall.degraded).toMatch(/vector search unavailable: model provider (stalled|did not answer in time)/);
  });
});

describe("a provider that trickles its body, never idle for the timeout", () => {
  it("fails chat and embedding calls by their deadline, and tears their requests down", async () => {
    await route({ cheap: { baseUrl: trickling.url }, embedding: { baseUrl: trickling.url, model: "trickled-embed" } });
    const chat = await engram.services.models.chat(tenantId(), "cheap", "summary");
    const embeddings = await engram.services.models.embeddings(tenantId());
    for (const call of [(): Promise<unknown> => chat!.invoke("hello"), () => embeddings!.embedDocuments(["a text to embed"])]) {
      const { error } = await timed(call());
      expectOutage(error, /did not answer in time/);
      // Torn down, not left dripping: the connection closes, so it holds no socket or queue slot.
      await until("the trickled connection to close", async () => trickling.open() === 0, 5_000);
    }
  });
});

describe("a provider that answers", () => {
  it("still answers at once on the operator's route", async () => {
    await route({ cheap: null, embedding: null });
    const chat = await engram.services.models.chat(tenantId(), "cheap", "summary");
    const { error } = await timed(chat!.invoke("hello"));
    expect(error).toBeNull();
    const embeddings = await engram.services.models.embeddings(tenantId());
    expect(await embeddings!.embedDocuments(["a text to embed"])).toEqual([[0.1, 0.2, 0.3]]);
  });
});

describe("what a call that got no answer costs", () => {
  // A provider that never answers whole may still have read the prompt and billed it; a call
  // that left no usage row let such a provider be called without end under any budget.
  const BUDGET = `mutation($input: UpdateTenantSettingsInput!) { updateTenantSettings(input: $input) { monthlyTokenBudget } }`;
  const db = () => forTenant(engram.services.db, tenantId());
  const rows = (chain: string) => engram.services.db.modelUsage.findMany({ where: { tenantId: tenantId(), chain }, orderBy: { createdAt: "asc" } });
  const setBudget = async (monthlyTokenBudget: number | null) => {
    const { errors } = await engram.gql(BUDGET, { input: { monthlyTokenBudget } });
    expect(errors).toBeUndefined();
  };

  it("records a stalled chat call's prompt as spent, so the budget pauses the tenant", async () => {
    await route({ cheap: { baseUrl: stalling.url } });
    const { spent } = await budgetStatus(db(), null);
    await setBudget(spent + 1);
    const before = (await rows("summary")).length;
    const chat = await engram.services.models.chat(tenantId(), "cheap", "summary");
    const prompt = "a prompt the provider read ".repeat(20);
    const tried = stalling.hits();
    const { error } = await timed(chat!.invoke(prompt));
    expectOutage(error, /stalled|did not answer in time/);
    // Both tries (ENGRAM_MODEL_MAX_RETRIES 1) were read and never answered: each may be billed.
    expect(stalling.hits() - tried).toBe(2);
    const recorded = (await rows("summary")).slice(before);
    expect(recorded).toHaveLength(1);
    expect(recorded[0].inputTokens).toBe(2 * countTokens(prompt));
    expect(recorded[0].outputTokens).toBe(0);
    expect((await budgetStatus(db(), null)).paused).toBe(true);
    // Paused: the next call is refused before anything is sent.
    const hits = stalling.hits();
    await expect(chat!.invoke("again")).rejects.toMatchObject({ code: "BUDGET_EXHAUSTED" });
    expect(stalling.hits()).toBe(hits);
    await setBudget(null);
  });

  it("records a stalled embedding call's texts as spent", async () => {
    await route({ embedding: { baseUrl: stalling.url, model: "stalled-embed" } });
    const before = (await rows("embed")).length;
    const embeddings = await engram.services.models.embeddings(tenantId());
    const { error } = await timed(embeddings!.embedDocuments(["a text the provider read", "and another one"]));
    expectOutage(error, /stalled|did not answer in time/);
    const recorded = (await rows("embed")).slice(before);
    expect(recorded).toHaveLength(1);
    expect(recorded[0]).toMatchObject({ model: "stalled-embed", outputTokens: 0 });
    expect(recorded[0].inputTokens).toBeGreaterThan(0);
  });

  it("adds a try that stalled to the call a later try answered", async () => {
    await route({ cheap: { baseUrl: stallingOnce.url } });
    const before = (await rows("summary")).length;
    const chat = await engram.services.models.chat(tenantId(), "cheap", "summary");
    const hits = stallingOnce.hits();
    const prompt = "a prompt sent twice ".repeat(20);
    const { error } = await timed(chat!.invoke(prompt));
    expect(error).toBeNull();
    expect(stallingOnce.hits() - hits).toBe(2);
    const recorded = (await rows("summary")).slice(before);
    expect(recorded).toHaveLength(1);
    // The provider's 7 for the answered try, and the tokenizer's count of the prompt for the stalled one.
    expect(recorded[0].inputTokens).toBe(7 + countTokens(prompt));
    expect(recorded[0].outputTokens).toBe(1);
  });

  it("records nothing for a call the provider answered with an error status (nothing was billed)", async () => {
    await route({ cheap: null, embedding: null });
    model.respond(() => ({ status: 500 }));
    try {
      const before = (await rows("summary")).length;
      const chat = await engram.services.models.chat(tenantId(), "cheap", "summary");
      const { error } = await timed(chat!.invoke("hello"));
      expectOutage(error, /answered 500/);
      expect(await rows("summary")).toHaveLength(before);
    } finally {
      model.respond(() => "{}");
    }
  });
});
