import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { budgetStatus } from "../src/governance/budget.ts";
import type { ChatModel } from "../src/models/metered.ts";
import { modelEnv, startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import { startSecondInstance, type TestInstance } from "./helpers/instances.ts";
import type { ModelServer, ScriptedAnswer } from "./helpers/model-server.ts";
import { until } from "./helpers/until.ts";

// Concurrent model calls of one tenant (jobs run 4 at a time per worker, re-ranks run in
// requests, and there may be several processes) must not all pass the budget check before any
// of them has spent: each holds its expected tokens from before it is sent.

const UPDATE = `mutation($input: UpdateTenantSettingsInput!) { updateTenantSettings(input: $input) { monthlyTokenBudget } }`;
const ANSWER = JSON.stringify({ summary: "x".repeat(400) });
const PROMPT = "hello ".repeat(200);

describe("the monthly budget under concurrent model calls", () => {
  let engram: TestEngram;
  let model: ModelServer;
  let second: TestInstance;
  // Every request waits at the model server until the test opens it, so the calls that were let
  // through are in flight together while the others are decided.
  let open: () => void = () => {};
  let opened: Promise<void>;
  let script: () => ScriptedAnswer = () => ANSWER;

  beforeAll(async () => {
    ({ model, engram } = await startEngramWithModel({ respond: async () => (await opened, script()), env: { ENGRAM_EMBEDDINGS: "offline" } }));
    second = await startSecondInstance(engram, modelEnv(model));
  });
  afterAll(async () => {
    await second?.stop();
    await engram?.stop();
    await model?.stop();
  });
  beforeEach(() => {
    opened = new Promise((resolve) => (open = resolve));
    script = () => ANSWER;
  });

  const db = () => forTenant(engram.services.db, engram.tenant.tenantId);
  const setLimit = async (limit: number | null) => {
    const { errors } = await engram.gql(UPDATE, { input: { monthlyTokenBudget: limit } });
    expect(errors).toBeUndefined();
  };
  const chat = async (services = engram.services) => (await services.models.chat(engram.tenant.tenantId, "cheap", "summary")) as ChatModel;
  const holds = () => engram.services.db.budgetReservation.count({ where: { tenantId: engram.tenant.tenantId } });

  /** Starts the calls, waits until each is at the model server or refused, then lets the server answer. */
  async function callTogether(models: ChatModel[]) {
    const before = model.requests.length;
    let refused = 0;
    const calls = models.map((m) =>
      m.invoke(PROMPT).catch((error) => {
        refused++;
        throw error;
      }),
    );
    const settled = Promise.allSettled(calls);
    await until("every call to be sent or refused", async () => model.requests.length - before + refused === models.length);
    open();
    const results = await settled;
    return {
      sent: model.requests.length - before,
      answered: results.filter((r) => r.status === "fulfilled").length,
      codes: results.flatMap((r) => (r.status === "rejected" ? [(r.reason as { code?: string }).code] : [])),
    };
  }

  it("lets one of 8 concurrent calls through when the budget has room for one; the rest get BUDGET_EXHAUSTED", async () => {
    await setLimit((await budgetStatus(db(), null)).spent + 1);
    const model8 = await chat();
    const result = await callTogether(Array.from({ length: 8 }, () => model8));
    expect(result).toEqual({ sent: 1, answered: 1, codes: Array(7).fill("BUDGET_EXHAUSTED") });
    expect(await holds()).toBe(0);
    // The one call spent the rest: the tenant is paused, and the next call is refused unsent.
    expect((await budgetStatus(db(), null)).paused).toBe(true);
    const before = model.requests.length;
    await expect(model8.invoke(PROMPT)).rejects.toMatchObject({ code: "BUDGET_EXHAUSTED" });
    expect(model.requests.length).toBe(before);
  });

  it("holds across processes: calls from two instances on one store still make only one request", async () => {
    await setLimit((await budgetStatus(db(), null)).spent + 1);
    const [here, there] = [await chat(), await chat(second.services)];
    const result = await callTogether(Array.from({ length: 8 }, (_, i) => (i % 2 ? here : there)));
    expect(result).toEqual({ sent: 1, answered: 1, codes: Array(7).fill("BUDGET_EXHAUSTED") });
    expect(await holds()).toBe(0);
  });

  it("lets concurrent calls through together under a budget with room, and gives back every hold", async () => {
    const spent = (await budgetStatus(db(), null)).spent;
    await setLimit(spent + 1_000_000);
    const model8 = await chat();
    // Each call's hold (its prompt and 2,000 output tokens) fits: all 8 reach the server at once.
    const result = await callTogether(Array.from({ length: 8 }, () => model8));
    expect(result).toEqual({ sent: 8, answered: 8, codes: [] });
    expect(await holds()).toBe(0);
    const usage = await engram.services.db.modelUsage.findMany({ where: { tenantId: engram.tenant.tenantId }, orderBy: { createdAt: "desc" }, take: 8 });
    expect((await budgetStatus(db(), null)).spent).toBe(spent + usage.reduce((sum, row) => sum + row.inputTokens + row.outputTokens, 0));
  });

  it("gives back a failed call's hold, so the next call is made", async () => {
    await setLimit((await budgetStatus(db(), null)).spent + 1);
    const model1 = await chat();
    script = () => ({ status: 500 });
    open();
    const before = model.requests.length;
    await expect(model1.invoke(PROMPT)).rejects.toMatchObject({ code: "MODEL_UNAVAILABLE" });
    expect(await holds()).toBe(0);
    script = () => ANSWER;
    await expect(model1.invoke(PROMPT)).resolves.toBeDefined();
    expect(model.requests.length).toBe(before + 2);
  });

  it("counts another process's hold until it lapses, so a crashed call never pauses the tenant for good", async () => {
    await setLimit((await budgetStatus(db(), null)).spent + 1);
    const model1 = await chat();
    open();
    const hold = { tenantId: engram.tenant.tenantId, tokens: 5_000 };
    // A live hold of a call in flight elsewhere: the rest of the budget is taken.
    await engram.services.db.budgetReservation.create({ data: { ...hold, id: "live", expiresAt: new Date(Date.now() + 3_600_000) } });
    const before = model.requests.length;
    const refused = await model1.invoke(PROMPT).catch((error) => error);
    expect(refused).toMatchObject({ code: "BUDGET_EXHAUSTED", details: { reserved: 5_000 } });
    expect(model.requests.length).toBe(before);
    // Its process died: past its expiry the hold no longer counts, and is cleared.
    await engram.services.db.budgetReservation.update({ where: { id: "live" }, data: { expiresAt: new Date(Date.now() - 1_000) } });
    await expect(model1.invoke(PROMPT)).resolves.toBeDefined();
    expect(model.requests.length).toBe(before + 1);
    expect(await holds()).toBe(0);
  });

});
