import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { DeleteFactDocument, ForgetUserDocument, RecallIndexStatusDocument, UpsertAgentDocument } from "../src/gql/graphql.ts";
import { forgetPhrases } from "../src/memory/forget.ts";
import { indexSnippets } from "../src/memory/recall/snippets.ts";
import { runTurnFollowUps } from "../src/work/follow-ups.ts";
import { applyRetention } from "../src/work/retention.ts";
import { runTurnWork } from "../src/work/turn-work.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { recordTurn } from "./helpers/turns.ts";

// recallIndexStatus is what a client or an eval polls until pending is 0. A turn the indexer
// leaves without a snippet on purpose, or whose snippet a forget took, must not keep it above 0.
// No worker: each test runs the jobs' work itself, so it knows what has run.

let engram: TestEngram;
beforeAll(async () => {
  engram = await startTestEngram();
  // No model work: the round writes the snippets, the keyword gate judges.
  const { errors } = await engram.gql(UpsertAgentDocument, { input: { externalId: "quiet", settings: { summaryOn: false, extractionOn: false } } });
  expect(errors).toBeUndefined();
}, 120_000);
afterAll(async () => {
  await engram?.stop();
});

const db = () => forTenant(engram.services.db, engram.tenant.tenantId);
const DAY = 86_400_000;

async function status(endUserId: string) {
  const { data, errors } = await engram.gql(RecallIndexStatusDocument, { endUserId }, engram.tenant.reader);
  expect(errors).toBeUndefined();
  return data.recallIndexStatus;
}
const caughtUp = { pending: 0, oldestPendingAt: null };

const say = (user: string, userMessage: string, assistantMessage: string, occurredAt?: Date) =>
  recordTurn(engram, {
    agentExternalId: "quiet",
    endUserExternalId: user,
    conversationExternalId: `${user}-1`,
    userMessage,
    assistantMessage,
    occurredAt: occurredAt?.toISOString(),
  });

/** The follow-ups job's round: the turns leave the outbox with their snippets, embedded. */
const followUps = () => runTurnFollowUps(db(), engram.services.deps);

async function keepMessages(keep: boolean) {
  const { errors } = await engram.gql(
    `mutation($on: Boolean!) { updateTenantSettings(input: { forgetDeletesMessages: $on }) { forgetDeletesMessages } }`,
    { on: !keep },
  );
  expect(errors).toBeUndefined();
}

describe("recallIndexStatus", () => {
  it("counts turns in the outbox and snippets without a vector, down to zero", async () => {
    const first = await say("ada", "I collect postcards from Lisbon.", "Lovely.");
    await say("ada", "I also keep bees.", "Nice.");
    const endUserId = first.conversation.endUser.id;
    const recorded = await db().turn.findUniqueOrThrow({ where: { id: first.id } });
    expect(await status(endUserId)).toEqual({ pending: 2, oldestPendingAt: recorded.createdAt.toISOString() });

    await followUps();
    expect(await status(endUserId)).toEqual(caughtUp);

    // A snippet whose vector was lost is not searchable until the reconcile sweep embeds it again.
    const snippet = await db().recallSnippet.findFirstOrThrow({ where: { conversationId: first.conversation.id } });
    await db().recallSnippet.update({ where: { id: snippet.id }, data: { indexedAt: null } });
    expect((await status(endUserId)).pending).toBe(1);
    await indexSnippets(db(), engram.services.deps, [snippet.id]);
    expect(await status(endUserId)).toEqual(caughtUp);
  });

  it("does not count the turn of a deleted fact's message, and counts the next turn until it is indexed", async () => {
    const turn = await say("bo", "My cat is called Miso.", "Cute.");
    const endUserId = turn.conversation.endUser.id;
    await followUps();
    const message = await db().message.findFirstOrThrow({ where: { conversationId: turn.conversation.id, role: "USER" } });
    const fact = await db().fact.create({
      data: { tenantId: engram.tenant.tenantId, endUserId, text: "The user's cat is called Miso.", origin: "EXTRACTOR", sourceMessageId: message.id },
    });
    const { errors } = await engram.gql(DeleteFactDocument, { id: fact.id });
    expect(errors).toBeUndefined();
    // The turn's snippet is gone and none is made from it again: nothing is left to index.
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id } })).toBe(0);
    expect(await status(endUserId)).toEqual(caughtUp);

    await say("bo", "I moved to Porto.", "Noted.");
    expect((await status(endUserId)).pending).toBe(1);
    await followUps();
    expect(await status(endUserId)).toEqual(caughtUp);
  });

  it("does not count turns whose messages a forget kept as a record", async () => {
    const turn = await say("cy", "My locker code is 4417.", "Saved.");
    await say("cy", "I prefer aisle seats.", "Noted.");
    const endUserId = turn.conversation.endUser.id;
    await followUps();
    await keepMessages(true);
    try {
      const { errors } = await engram.gql(ForgetUserDocument, { endUserId });
      expect(errors).toBeUndefined();
    } finally {
      await keepMessages(false);
    }
    expect(await db().message.count({ where: { conversationId: turn.conversation.id, forgottenAt: { not: null } } })).toBe(4);
    expect(await status(endUserId)).toEqual(caughtUp);
  });

  it("does not count a turn whose snippet a forget of what it said took, its reply left", async () => {
    const turn = await say("di", "My locker code is 4417.", "Saved.");
    const endUserId = turn.conversation.endUser.id;
    await followUps();
    await forgetPhrases(db(), engram.services.deps, endUserId, ["locker code"], { reason: "test" });
    expect(await db().message.findMany({ where: { conversationId: turn.conversation.id }, select: { content: true } })).toEqual([{ content: "Saved." }]);
    expect(await status(endUserId)).toEqual(caughtUp);
  });

  it("counts a forget request's turn until its job has forgotten, then nothing (messages kept)", async () => {
    await say("eve", "My bike is a red Brompton.", "Nice.");
    const asking = await say("eve", "Please forget my bike.", "Forgotten.");
    const endUserId = asking.conversation.endUser.id;
    await keepMessages(true);
    try {
      // The round leaves the forget request in the outbox for its own job.
      await followUps();
      expect((await status(endUserId)).pending).toBe(1);
      const work = await runTurnWork(db(), engram.services.deps, { tenantId: engram.tenant.tenantId, turnId: asking.id });
      expect(work.status).toBe("FORGOT");
    } finally {
      await keepMessages(false);
    }
    expect(await db().message.count({ where: { conversationId: asking.conversation.id, forgottenAt: { not: null } } })).toBe(2);
    expect(await status(endUserId)).toEqual(caughtUp);
  });

  it("does not count turns whose snippets the retention window took", async () => {
    const now = new Date();
    const turn = await say("flo", "My old order was a red kettle.", "Noted.", new Date(now.getTime() - 40 * DAY));
    await say("flo", "It arrived broken.", "Sorry.", new Date(now.getTime() - 40 * DAY));
    const endUserId = turn.conversation.endUser.id;
    await followUps();
    const result = await applyRetention(engram.services.deps, engram.tenant.tenantId, { retentionDays: 30, now });
    expect(result.snippetsDeleted).toBeGreaterThanOrEqual(2);
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id } })).toBe(0);
    expect(await status(endUserId)).toEqual(caughtUp);
  });
});
