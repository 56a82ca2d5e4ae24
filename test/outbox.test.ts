import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { dispatchPendingTurns } from "../src/work/dispatch.ts";
import { reconcileRecall } from "../src/work/reconcile.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { allIndexed } from "./helpers/recall.ts";
import { recordTurn } from "./helpers/turns.ts";
import { until } from "./helpers/until.ts";

// The turn row is the outbox: a crash between the turn's commit and the enqueue of its follow-ups
// leaves followUpsQueuedAt null, and the dispatcher queues them; nothing waits for a client retry.
let engram: TestEngram;
beforeAll(async () => {
  engram = await startTestEngram({ worker: true });
}, 120_000);
afterAll(() => engram?.stop());

describe("the outbox", () => {
  it("queues the follow-ups of turns committed without them, and every such turn gets its snippets", async () => {
    const turns = [];
    for (let n = 1; n <= 3; n++) {
      turns.push(
        await recordTurn(engram, {
          agentExternalId: "ob",
          endUserExternalId: "ob-user",
          conversationExternalId: "ob-1",
          clientTurnId: `ob-${n}`,
          userMessage: `I bought item number ${n}.`,
          assistantMessage: "Noted.",
        }),
      );
    }
    await allIndexed(engram, engram.tenant.tenantId, 120_000);
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    // What a crash after the commit and before the enqueue leaves: turns without snippets, not dispatched.
    const ids = turns.map((t) => t.id);
    await db.recallSnippet.deleteMany({ where: { conversationId: turns[0].conversation.id } });
    await db.turn.updateMany({ where: { id: { in: ids } }, data: { followUpsQueuedAt: null, createdAt: new Date(Date.now() - 120_000) } });

    const dispatched = await dispatchPendingTurns(engram.services.deps);
    expect(dispatched[engram.tenant.tenantId]).toBe(3);
    await until("the dispatched follow-ups", async () => (await db.turn.count({ where: { id: { in: ids }, followUpsQueuedAt: null } })) === 0, 120_000);
    await allIndexed(engram, engram.tenant.tenantId, 120_000);
    expect(await db.recallSnippet.count({ where: { conversationId: turns[0].conversation.id, kind: "TURN" } })).toBe(3);
    // Nothing is left to dispatch, and a second sweep queues nothing twice.
    expect(await dispatchPendingTurns(engram.services.deps)).toEqual({});
  }, 300_000);

  it("goes on to the other tenants when one tenant's sweep fails, as the recall reconcile does", async () => {
    const { deps } = engram.services;
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const turn = await recordTurn(engram, { agentExternalId: "ob", endUserExternalId: "ob-user", conversationExternalId: "ob-2", userMessage: "I sold item 4.", assistantMessage: "Ok." });
    await db.turn.update({ where: { id: turn.id }, data: { followUpsQueuedAt: null, createdAt: new Date(Date.now() - 120_000) } });
    // A tenant listed first whose every statement fails, and whose embedding route is refused.
    const broken = { id: "broken-tenant", name: "broken", createdAt: new Date() };
    const failing = { $queryRaw: () => Promise.reject(new Error("this tenant's store is broken")) } as unknown as ReturnType<typeof deps.tenants.scoped>;
    const errors: string[] = [];
    const sweepDeps = {
      ...deps,
      log: { ...deps.log, error: (message: string) => errors.push(message) },
      tenants: { active: async () => [broken, ...(await deps.tenants.active())], scoped: (id: string) => (id === broken.id ? failing : deps.tenants.scoped(id)) },
      embeddings: { ...deps.embeddings, forTenant: (id: string) => (id === broken.id ? Promise.reject(new Error("route refused")) : deps.embeddings.forTenant(id)) },
    } as typeof deps;
    expect(await dispatchPendingTurns(sweepDeps)).toEqual({ [engram.tenant.tenantId]: 1 });
    await expect(reconcileRecall(sweepDeps, {})).resolves.toBeDefined();
    expect(errors).toEqual([expect.stringMatching(/outbox.*others go on/), expect.stringMatching(/reconcile.*others go on/)]);
  }, 120_000);

  it("drains the turns of an agent with no model work in batches: each gets its snippet and vector, and a forget request its own job", async () => {
    await engram.gql(`mutation { upsertAgent(input: { externalId: "batch", settings: { summaryOn: false, extractionOn: false } }) { id } }`);
    const say = (n: number, userMessage: string) =>
      recordTurn(engram, { agentExternalId: "batch", endUserExternalId: `batch-user-${n % 2}`, conversationExternalId: `batch-${n % 4}`, clientTurnId: `batch-${n}`, userMessage, assistantMessage: "Got it." });
    const turns = [];
    for (let n = 0; n < 12; n++) turns.push(await say(n, n === 4 ? "My locker code is 4711." : `Note number ${n} about the garden.`));
    // Same user (4 % 2, 8 % 2) and conversation (8 % 4 = 0 = 4 % 4): forget what turn 4 said.
    const forget = await say(8 + 4, "Please forget my locker code.");
    await allIndexed(engram, engram.tenant.tenantId, 120_000);
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const ids = turns.map((t) => t.id);
    expect(await db.turn.count({ where: { id: { in: [...ids, forget.id] }, followUpsQueuedAt: null } })).toBe(0);
    // The forget request was heard (by its own job, after its follow-ups): the message that said it is gone, with its snippet.
    await until("the forget request's job", async () => (await db.message.count({ where: { content: { contains: "4711" } } })) === 0, 120_000);
    expect(await db.recallSnippet.count({ where: { text: { contains: "4711" } } })).toBe(0);
    const kept = await db.recallSnippet.findMany({ where: { conversationId: { in: turns.map((t) => t.conversation.id) }, kind: "TURN" } });
    expect(kept.filter((s) => s.text.includes("garden"))).toHaveLength(11);
    expect(kept.every((s) => s.indexedAt)).toBe(true);
    // The round's one statement stores each snippet's message seqs, in messageIds' order.
    const seqOf = new Map((await db.message.findMany({ where: { id: { in: kept.flatMap((s) => s.messageIds) } } })).map((m) => [m.id, m.seq]));
    for (const s of kept) expect(s.messageSeqs).toEqual(s.messageIds.map((id) => seqOf.get(id)));
    // Only the forget request went to a turn job of its own.
    const own = await db.$queryRaw<{ turnId: string }[]>`
      SELECT DISTINCT "data"->>'turnId' AS "turnId" FROM "agenda_jobs" WHERE "name" = 'memory.turn' AND "data"->>'turnId' = ANY(${[...ids, forget.id]}::text[])`;
    expect(own.map((j) => j.turnId)).toEqual([forget.id]);
  }, 300_000);
});
