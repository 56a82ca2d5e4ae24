import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { dispatchPendingTurns } from "../src/work/dispatch.ts";
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
});
