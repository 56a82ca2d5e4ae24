import pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { forTenant } from "../src/db.ts";
import { budgetStatus } from "../src/governance/budget.ts";
import { BUDGET_REASON } from "../src/memory/recall/recall.ts";
import { runIndexSnippets } from "../src/work/index-snippets.ts";
import { reconcileRecall } from "../src/work/reconcile.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { allIndexed, CONTEXT, RECALL, say } from "./helpers/recall.ts";
import { until } from "./helpers/until.ts";

// Embeddings on a remote route obey the tenant's monthly token budget as chat calls do: each call
// holds its expected tokens first, and is refused once the budget is spent. Before, they were
// metered but never refused: indexing and every search's query embedding kept spending.

const UPDATE = `mutation($input: UpdateTenantSettingsInput!) { updateTenantSettings(input: $input) { monthlyTokenBudget } }`;
const STATUS = `query($endUserId: ID!) { recallIndexStatus(endUserId: $endUserId) { pending } }`;
// No chat work: the turns' only model calls are their embeddings.
const AGENT = `mutation { upsertAgent(input: { externalId: "quiet", settings: { summaryOn: false, extractionOn: false } }) { id } }`;

/** A small vector from a text's words, so related texts are near. */
const vectorOf = (text: string) => {
  const v = [0, 0, 0, 0, 0, 0, 0, 1];
  for (const word of text.toLowerCase().split(/\W+/)) if (word) v[word.charCodeAt(0) % 7] += 1;
  return v;
};

describe("embeddings on a paid route and the monthly token budget", () => {
  let engram: TestEngram;
  let model: ModelServer;

  beforeAll(async () => {
    ({ model, engram } = await startEngramWithModel({
      worker: true,
      embed: (input) => input.map(vectorOf),
      // A chat call (the re-rank judge) fails as an outage: nothing but embeddings spends.
      respond: () => ({ status: 500 }),
      env: { ENGRAM_EMBEDDINGS: "openai" },
    }));
    expect((await engram.gql(AGENT)).errors).toBeUndefined();
  }, 120_000);
  afterAll(async () => {
    await engram?.stop();
    await model?.stop();
  });

  const tenantId = () => engram.tenant.tenantId;
  const db = () => forTenant(engram.services.db, tenantId());
  const setLimit = async (limit: number | null) => expect((await engram.gql(UPDATE, { input: { monthlyTokenBudget: limit } })).errors).toBeUndefined();
  const spent = async () => (await budgetStatus(db(), null)).spent;
  const holds = () => engram.services.db.budgetReservation.count({ where: { tenantId: tenantId() } });
  const pending = async (endUserId: string) => (await engram.gql(STATUS, { endUserId })).data.recallIndexStatus.pending as number;
  const embedUsage = () => engram.services.db.modelUsage.findMany({ where: { tenantId: tenantId(), chain: "embed" }, orderBy: { createdAt: "asc" } });
  const remember = (conversation: string, message: string) => say(engram, { user: "ada", conversation, agent: "quiet" }, message, "Noted.");
  /** Waits until the worker has taken every turn out of the outbox and no index job is queued or running. */
  const followUpsDone = () =>
    until("the turns' follow-ups and index jobs to be done", async () => {
      const [outbox, [{ queued }]] = await Promise.all([
        engram.services.db.turn.count({ where: { tenantId: tenantId(), followUpsQueuedAt: null } }),
        engram.services.db.$queryRaw<{ queued: number }[]>`
          SELECT count(*)::int AS queued FROM "agenda_jobs"
          WHERE "name" IN ('recall.index', 'memory.follow-ups') AND "data"->>'tenantId' = ${tenantId()}
            AND ("next_run_at" IS NOT NULL OR "locked_at" IS NOT NULL)`,
      ]);
      return outbox === 0 && queued === 0;
    });

  /**
   * The statements `work` sends on the tables a model call's meter and budget write (as
   * test/query-count counts them; the worker's own polling of the queue runs meanwhile), once its
   * usage rows are stored.
   */
  async function statementsOf(work: () => Promise<unknown>) {
    const spy = vi.spyOn(pg.Client.prototype, "query");
    try {
      await work();
      await engram.services.models.settled();
      const texts = spy.mock.calls.map(([query]) => (typeof query === "string" ? query : String((query as { text?: string }).text)));
      return texts.filter((text) => /INSERT INTO "ModelUsage"|"BudgetReservation"|pg_advisory/.test(text)).length;
    } finally {
      spy.mockRestore();
    }
  }

  it("holds nothing for a tenant without a budget: an embedding writes its usage row and no hold", async () => {
    await setLimit(null);
    const embeddings = (await engram.services.models.embeddings(tenantId()))!;
    expect(await statementsOf(() => embeddings.embedDocuments(["one text", "another"]))).toBe(1);
    expect(await statementsOf(() => embeddings.embedQuery("a query"))).toBe(1);
    // With a budget, the same call holds its tokens first (a transaction under the tenant's lock) and gives them back after.
    await setLimit((await spent()) + 1_000_000);
    const budgeted = (await engram.services.models.embeddings(tenantId()))!;
    // The lock, the check-and-hold, the usage row, the hold given back.
    expect(await statementsOf(() => budgeted.embedDocuments(["one text", "another"]))).toBe(4);
    expect(await holds()).toBe(0);
    await setLimit(null);
  });

  it("stops indexing at the budget: turns stay pending without a provider call, and are indexed once it is raised", async () => {
    const { endUserId } = await remember("kayak", "My kayak is blue and I paddle it on Lough Derg.");
    await allIndexed(engram);
    // Nearly spent: room for one more call, which goes ahead alone (it may overshoot, as a chat call may).
    await setLimit((await spent()) + 1);
    await remember("garden", "The garden has three apple trees and a pear.");
    await allIndexed(engram);
    const lone = (await embedUsage()).at(-1)!;
    const calls = model.embeddingRequests.length;

    // Spent now: the next turns' snippets are written but not embedded, and nothing is lost.
    await remember("bikes", "I ride a green bicycle to work on Mondays.");
    await remember("bikes", "On Fridays I take the tram instead.");
    await followUpsDone();
    expect(model.embeddingRequests.length).toBe(calls);
    expect(await pending(endUserId)).toBe(2);
    // What an index job does meanwhile: ends paused (no failure to retry or dead-letter), no call made.
    const waiting = (await engram.services.db.recallSnippet.findMany({ where: { tenantId: tenantId(), indexedAt: null }, select: { id: true } })).map((s) => s.id);
    expect(await runIndexSnippets(db(), engram.services.deps, { tenantId: tenantId(), snippetIds: waiting })).toMatchObject({ indexed: 0, paused: true });
    // And the reconcile sweep queues nothing for a tenant whose budget is spent.
    expect(await reconcileRecall(engram.services.deps, { tenantId: tenantId() }, { graceMs: 0 })).toEqual({});
    expect(model.embeddingRequests.length).toBe(calls);
    expect(await holds()).toBe(0);
    // Spend passed the limit by the one call let through alone, and no more.
    const status = await budgetStatus(db(), null);
    expect(status.paused).toBe(true);
    expect(status.spent).toBeLessThanOrEqual(status.limit! + lone.inputTokens);

    await setLimit(status.spent + 1_000_000);
    expect(await reconcileRecall(engram.services.deps, { tenantId: tenantId() }, { graceMs: 0 })).toEqual({ [tenantId()]: 2 });
    await allIndexed(engram);
    expect(await pending(endUserId)).toBe(0);
    expect(model.embeddingRequests.length).toBeGreaterThan(calls);
    expect(await holds()).toBe(0);
    await setLimit(null);
  });

  it("recall and context answer keyword matches with the budget as the reason, and embed nothing", async () => {
    const { endUserId, conversationId } = await remember("boat", "My sailing boat is called the Heron and she is moored in Kinsale.");
    await allIndexed(engram);
    // With room, the query is embedded, held, recorded after the reply, and its hold given back.
    await setLimit((await spent()) + 1_000_000);
    let calls = model.embeddingRequests.length;
    const roomy = await engram.gql(RECALL, { input: { endUserId, text: "sailing boat Heron" } });
    expect(roomy.errors).toBeUndefined();
    expect(roomy.data.recall.degraded).toBeNull();
    expect(model.embeddingRequests.length).toBe(calls + 1);
    expect(await holds()).toBe(0);

    await setLimit(await spent());
    calls = model.embeddingRequests.length;
    const before = await spent();
    const { data, errors } = await engram.gql(RECALL, { input: { endUserId, text: "sailing boat Heron" } });
    expect(errors).toBeUndefined();
    expect(data.recall.degraded).toBe(`vector search unavailable: ${BUDGET_REASON}`);
    expect(data.recall.candidates[0]).toMatchObject({ conversationId, vectorScore: null, keywordRank: 1 });

    const later = await say(engram, { user: "ada", conversation: "boat-later", agent: "quiet" }, "Hello again.", "Hi!");
    const context = await engram.gql(CONTEXT, { input: { conversationId: later.conversationId, message: "Do you remember what my sailing boat is called?" } });
    expect(context.errors).toBeUndefined();
    // The re-rank judge's call has no room either: the similarity floor chose, and it says why.
    expect(context.data.context.degraded).toEqual([
      `vector search unavailable: ${BUDGET_REASON}`,
      expect.stringMatching(/^recall judge unavailable: .*budget.*; the similarity floor chose instead$/),
    ]);
    expect(context.data.context.blocks.find((b: { kind: string }) => b.kind === "RECALL")?.text).toContain("Heron");

    expect(model.embeddingRequests.length).toBe(calls);
    expect(await spent()).toBe(before);
    expect(await holds()).toBe(0);
    await setLimit(null);
  });
});
