import { RunnableLambda } from "@langchain/core/runnables";
import type { ChromaClient } from "chromadb";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { OfflineEmbeddings } from "../src/embeddings/offline.ts";
import type { Deps } from "../src/deps.ts";
import { forTenant, type TenantDb } from "../src/db.ts";
import type { VerbatimScores } from "../src/chains/verbatim-judge.ts";
import { rewriteSummary } from "../src/memory/conversations/summary.ts";
import { applyCandidate } from "../src/memory/facts/facts.ts";
import { extractFacts } from "../src/memory/facts/extraction.ts";
import type { CandidateFact } from "../src/chains/extractor.ts";
import type { FactJudgment } from "../src/chains/fact-judge.ts";
import { forgetConversation, forgetExpired, forgetFact, forgetPhrases, forgetUser } from "../src/memory/forget.ts";
import {
  createTurnSnippets,
  indexSnippets,
  insertTurnSnippets,
  planSnippetsOfTurns,
  syncFactKeys,
  syncSummaryKeys,
} from "../src/memory/recall/snippets.ts";
import { gateByKeywords, gateMessage, messageHashOf } from "../src/memory/gate/gate.ts";
import { runIndexSnippets } from "../src/work/index-snippets.ts";
import { takeFromOutbox } from "../src/work/outbox.ts";
import { deleteOwedVectors, reconcileRecall } from "../src/work/reconcile.ts";
import { deleteVectorsJob } from "../src/queue.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { chromaOf, RECALL, say, vectorIds } from "./helpers/recall.ts";
import { serverUrl } from "./helpers/store.ts";
import { until } from "./helpers/until.ts";

// Forgetting while other work runs: a snippet, a key or a fact planned from what is being
// forgotten and written after the forget's first sweep must not survive it. The interleavings
// are made by hand (the job worker is off): a step is run between two of the forget's, or the
// forget's own vector delete runs the other work first.
let engram: TestEngram;
// Chroma starts with the first vector written: its client is made when first needed.
let chroma: ChromaClient | undefined;
let db: TenantDb;
const reason = { reason: "test" };

const snippetsOf = (endUserId: string, kind?: "TURN" | "FACT" | "SUMMARY") =>
  engram.services.db.recallSnippet.findMany({ where: { endUserId, ...(kind ? { kind } : {}) }, select: { id: true } }).then((r) => r.map((s) => s.id));
const vectorsOf = (endUserId: string) => vectorIds((chroma ??= chromaOf(engram)), engram.tenant.tenantId, { endUserId });
const keepMessages = (keep: boolean) =>
  engram.gql(`mutation($on: Boolean!) { updateTenantSettings(input: { forgetDeletesMessages: $on }) { forgetDeletesMessages } }`, { on: !keep }, engram.tenant.admin);

/** The deps with `vectors.delete` running `first` before its first call goes through. */
function onFirstVectorDelete(first: () => Promise<unknown>): Deps {
  const deps = engram.services.deps;
  let ran = false;
  const vectors: Deps["vectors"] = {
    ...deps.vectors,
    async delete(tenantId, selector) {
      if (!ran) {
        ran = true;
        await first();
      }
      return deps.vectors.delete(tenantId, selector);
    },
  };
  return { ...deps, vectors };
}

/** A turn with its snippet indexed, and a fact from its user message with its recall key indexed. */
async function turnWithFactKey(user: string, message: string, fact: string, confirmedAt = new Date()) {
  const turn = await say(engram, { user, conversation: `${user}-1` }, message, "Noted.");
  const source = await engram.services.db.message.findFirstOrThrow({ where: { conversationId: turn.conversationId, seq: 1 } });
  const made = await engram.services.db.fact.create({
    data: { tenantId: engram.tenant.tenantId, endUserId: turn.endUserId, text: fact, origin: "EXTRACTOR", sourceMessageId: source.id, confirmedAt },
  });
  const snippet = await createTurnSnippets(db, turn.conversationId, { firstSeq: 1, lastSeq: 2 });
  await indexSnippets(db, engram.services.deps, [...snippet, ...(await syncFactKeys(db, engram.services.deps, turn.endUserId))]);
  const [key] = await snippetsOf(turn.endUserId, "FACT");
  expect(await vectorsOf(turn.endUserId)).toContain(key);
  return { ...turn, factId: made.id, keyId: key, sourceId: source.id };
}

/** `db` with `fact.findMany` running `meanwhile` after its read: a job that read the facts, then the delete, then the job's write. */
const afterFactsRead = (meanwhile: () => Promise<unknown>): TenantDb =>
  new Proxy(db, {
    get(target, prop) {
      if (prop === "fact") {
        const findMany = async (args: object) => {
          const facts = await target.fact.findMany(args as never);
          await meanwhile();
          return facts;
        };
        return { ...target.fact, findMany };
      }
      const value = Reflect.get(target, prop, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });

beforeAll(async () => {
  engram = await startTestEngram();
  db = forTenant(engram.services.db, engram.tenant.tenantId);
}, 120_000);
afterAll(async () => {
  await engram?.stop();
});

describe("a turn's snippet planned before a forget", () => {
  for (const keep of [false, true]) {
    it(`is not written after it (messages ${keep ? "kept, marked forgotten" : "deleted"})`, async () => {
      await keepMessages(keep);
      const user = keep ? "ivy-kept" : "ivy";
      const turn = await say(engram, { user, conversation: `${user}-1` }, "My gate code is 5521.", "Saved.");
      const plan = await planSnippetsOfTurns(db, [{ conversationId: turn.conversationId, endUserId: turn.endUserId, firstSeq: 1, lastSeq: 2 }]);
      expect(plan.rows).toHaveLength(1);
      await forgetPhrases(db, engram.services.deps, turn.endUserId, ["gate code"], reason);
      const rows = plan.rows.map(({ turn: _, ...row }) => row);
      const inserted = await db.$queryRaw<{ id: string }[]>`WITH ${insertTurnSnippets(engram.tenant.tenantId, rows)} SELECT "id" FROM "inserted"`;
      expect(inserted).toEqual([]);
      expect(await snippetsOf(turn.endUserId)).toEqual([]);
      // The same insert of a turn nobody forgot goes in, with its seqs.
      const other = await say(engram, { user, conversation: `${user}-2` }, "I like window seats.", "Noted.");
      const fresh = await planSnippetsOfTurns(db, [{ conversationId: other.conversationId, endUserId: other.endUserId, firstSeq: 1, lastSeq: 2 }]);
      const written = await db.$queryRaw<{ id: string }[]>`
        WITH ${insertTurnSnippets(engram.tenant.tenantId, fresh.rows.map(({ turn: _, ...row }) => row))} SELECT "id" FROM "inserted"`;
      expect(written).toHaveLength(1);
      expect(await db.recallSnippet.findUniqueOrThrow({ where: { id: written[0].id } })).toMatchObject({ messageSeqs: [1, 2], kind: "TURN" });
    });
  }

  it("written between the forget's first sweep and the messages' delete is swept again (forgetUser)", async () => {
    await keepMessages(false);
    const turn = await say(engram, { user: "jude", conversation: "jude-1" }, "My locker code is 8812.", "Saved.");
    // The turn's job writes its snippet while forgetUser deletes the user's vectors.
    const deps = onFirstVectorDelete(() => createTurnSnippets(db, turn.conversationId, { firstSeq: 1, lastSeq: 2 }));
    const receipt = await forgetUser(db, deps, turn.endUserId, reason);
    expect(receipt.snippets).toBe(1);
    expect(await snippetsOf(turn.endUserId)).toEqual([]);
  });

  it("written between the forget's first sweep and the messages' delete is swept again (forgetPhrases)", async () => {
    await keepMessages(true);
    // An earlier turn with its snippet, found by the first sweep; while its vector is deleted the
    // newer turn's job writes the newer turn's snippet.
    const earlier = await say(engram, { user: "kai", conversation: "kai-1" }, "I bought a safe.", "Good idea.");
    await createTurnSnippets(db, earlier.conversationId, { firstSeq: 1, lastSeq: 2 });
    const turn = await say(engram, { user: "kai", conversation: "kai-1" }, "My safe combination is 3141.", "Saved.");
    const deps = onFirstVectorDelete(() => createTurnSnippets(db, turn.conversationId, { firstSeq: 3, lastSeq: 4 }));
    const receipt = await forgetPhrases(db, deps, turn.endUserId, ["safe"], reason);
    expect(receipt.snippets).toBe(2);
    expect(await snippetsOf(turn.endUserId)).toEqual([]);
    expect(await db.message.count({ where: { conversationId: turn.conversationId, forgottenAt: null, content: { contains: "safe" } } })).toBe(0);
  });
});

describe("what 'forget my X' matches", () => {
  it("takes a fact by whom it is about, as its subject names them, and the message it was read from", async () => {
    const said = await say(engram, { user: "ulla", conversation: "ulla-1" }, "She can't have peanuts at all.", "Noted.");
    const message = await engram.services.db.message.findFirstOrThrow({ where: { conversationId: said.conversationId, seq: 1 } });
    const ADD = `mutation($input: AddFactInput!) { addFact(input: $input) { id } }`;
    const about = await engram.gql(ADD, { input: { endUserId: said.endUserId, text: "Is allergic to peanuts.", subject: "Ana (daughter)" } });
    const other = await engram.gql(ADD, { input: { endUserId: said.endUserId, text: "The user drinks green tea." } });
    expect([about.errors, other.errors]).toEqual([undefined, undefined]);
    await engram.services.db.fact.update({ where: { id: about.data.addFact.id }, data: { sourceMessageId: message.id } });
    const receipt = await forgetPhrases(db, engram.services.deps, said.endUserId, ["Ana"], reason);
    expect(receipt.facts).toBe(1);
    // Deleted, or kept as a record but forgotten (the tenant's forgetDeletesMessages).
    expect(await engram.services.db.message.count({ where: { id: message.id, forgottenAt: null } })).toBe(0);
    expect((await engram.services.db.fact.findMany({ where: { endUserId: said.endUserId } })).map((f) => f.text)).toEqual(["The user drinks green tea."]);
  });
});

describe("a forget's second look", () => {
  it("finds a snippet matched by its text alone (no one message says it) written meanwhile", async () => {
    await keepMessages(false);
    const said = await say(engram, { user: "rio", conversation: "rio-1" }, "I bought a safe with a code lock.", "Good idea.");
    await createTurnSnippets(db, said.conversationId, { firstSeq: 1, lastSeq: 2 });
    // "safe" in the question, "code" in the reply: the turn matches "safe code", neither message does.
    await say(engram, { user: "rio", conversation: "rio-1" }, "Where is my safe?", "The code is in your notes app.");
    const deps = onFirstVectorDelete(() => createTurnSnippets(db, said.conversationId, { firstSeq: 3, lastSeq: 4 }));
    const receipt = await forgetPhrases(db, deps, said.endUserId, ["safe code"], reason);
    expect(receipt).toMatchObject({ snippets: 2, messages: 1 });
    expect(await snippetsOf(said.endUserId)).toEqual([]);
  });

  it("lets no summary rewrite begun before the forget land after it: the forget first moves the summary it started from", async () => {
    const turn = await say(engram, { user: "sol", conversation: "sol-1" }, "My PIN is 2468.", "Saved.");
    await createTurnSnippets(db, turn.conversationId, { firstSeq: 1, lastSeq: 2 });
    const started = await db.conversation.findUniqueOrThrow({ where: { id: turn.conversationId } });
    let landed = -1;
    // A rewrite that read the conversation before the forget commits while the forget runs (its compare-and-set, summary.ts).
    const deps = onFirstVectorDelete(async () => {
      landed = (
        await db.conversation.updateMany({
          where: { id: turn.conversationId, summaryThroughSeq: started.summaryThroughSeq, summary: started.summary },
          data: { summary: "The user's PIN is 2468.", summaryThroughSeq: 2 },
        })
      ).count;
    });
    await forgetPhrases(db, deps, turn.endUserId, ["PIN"], reason);
    expect(landed).toBe(0);
    expect(await db.conversation.findUniqueOrThrow({ where: { id: turn.conversationId } })).toMatchObject({ summary: null, summaryThroughSeq: 2 });
  });
});

describe("\"forget my X\" asked in a conversation", () => {
  const progressOf = (conversationId: string) =>
    db.conversation.findUniqueOrThrow({ where: { id: conversationId }, select: { extractedThroughSeq: true, summaryThroughSeq: true, summary: true } });

  it("closes that conversation to the extractor and the summary only through the turn that asked", async () => {
    await keepMessages(false);
    const who = { user: "una", conversation: "una-1" };
    const first = await say(engram, who, "My PIN is 1357.", "Saved.");
    await createTurnSnippets(db, first.conversationId, { firstSeq: 1, lastSeq: 2 });
    const ask = await say(engram, who, "Please forget my PIN.", "Done.");
    // Said after the request, before its forget ran (the gate job runs seconds later).
    await say(engram, who, "I adopted a cat called Miso.", "Lovely.");
    const other = await say(engram, { user: "una", conversation: "una-2" }, "My PIN is on a card.", "Ok.");
    await say(engram, { user: "una", conversation: "una-2" }, "I like tea.", "Noted.");
    // The gate's stored verdicts: the request's names what it forgets; the cat's, the caller's, asks nothing.
    const verdict = (message: string, forget: string, forgetTargets: string[]) =>
      db.gateVerdict.create({
        data: { tenantId: engram.tenant.tenantId, conversationId: ask.conversationId, messageHash: messageHashOf(message), remember: forget === "NONE", forget, forgetTargets, needsRecall: false, decidedBy: "CALLER" },
      });
    await verdict("Please forget my PIN.", "SOME", ["PIN"]);
    const cat = await verdict("I adopted a cat called Miso.", "NONE", []);
    // And one more while the forget runs, saying it again.
    const deps = onFirstVectorDelete(() => say(engram, who, "Oh, my PIN is 4242 now.", "Noted."));
    const receipt = await forgetPhrases(db, deps, ask.endUserId, ["PIN"], { ...reason, conversationId: ask.conversationId, askedThroughSeq: 4 });
    expect(receipt.messages).toBe(4);
    // The asking conversation through seq 4, the turn that asked; the cat (5–6) is read as usual.
    expect(await progressOf(ask.conversationId)).toMatchObject({ extractedThroughSeq: 4, summaryThroughSeq: 4 });
    expect((await db.message.findMany({ where: { conversationId: ask.conversationId }, select: { seq: true } })).map((m) => m.seq)).toEqual([2, 4, 5, 6, 8]);
    expect((await db.gateVerdict.findMany({ where: { conversationId: ask.conversationId }, select: { id: true } })).map((v) => v.id)).toEqual([cat.id]);
    // Another conversation the words were said in: through what it had said when the forget ran.
    expect(await progressOf(other.conversationId)).toMatchObject({ extractedThroughSeq: 4, summaryThroughSeq: 4 });
  });

  it("lets no summary land that folded a matching message said after the turn that asked", async () => {
    await keepMessages(false);
    const who = { user: "vik", conversation: "vik-1" };
    const ask = await say(engram, who, "Forget my PIN please.", "Done.");
    await say(engram, who, "Actually my PIN is 9999.", "Ok.");
    for (const n of [1, 2, 3]) await say(engram, who, `Question ${n}?`, `Answer ${n}.`);
    // The summary already covers the turn that asked: the forget's close moves nothing, so only
    // the folded message being gone stops the rewrite (its compare-and-set, summary.ts).
    await db.conversation.update({ where: { id: ask.conversationId }, data: { summaryThroughSeq: 2 } });
    const ignore = () => {};
    let forgot = false;
    const outcome = await rewriteSummary(db, {
      summarizer: RunnableLambda.from(async (input: { messages: { content: string }[] }) => {
        expect(input.messages.map((m) => m.content)).toContain("Actually my PIN is 9999.");
        await forgetPhrases(db, engram.services.deps, ask.endUserId, ["PIN"], { ...reason, conversationId: ask.conversationId, askedThroughSeq: 2 });
        forgot = true;
        return "The user's PIN is 9999.";
      }),
      lossJudge: RunnableLambda.from(async () => ({ lost: false, reason: "nothing lost" })),
      verbatimJudge: RunnableLambda.from(async () => new Map() as VerbatimScores),
      pubsub: engram.services.deps.pubsub,
      log: { debug: ignore, info: ignore, warn: ignore, error: ignore },
    }, ask.conversationId);
    expect(forgot).toBe(true);
    expect(outcome).toEqual({ status: "SUPERSEDED" });
    expect(await progressOf(ask.conversationId)).toMatchObject({ summary: null, summaryThroughSeq: 2 });
    expect(await db.summaryRevision.count({ where: { conversationId: ask.conversationId } })).toBe(0);
  });
});

describe("a forget and a turn's indexing at the same time", () => {
  it("leave no snippet of what was forgotten, and neither fails (20 times, in either order)", async () => {
    await keepMessages(false);
    for (let i = 0; i < 20; i++) {
      const who = { user: `tam-${i}`, conversation: `tam-${i}-1` };
      const first = await say(engram, who, `My badge number is ${1000 + i}.`, "Saved.");
      await say(engram, who, "And my badge colour is blue.", "Saved too.");
      const indexing = () => createTurnSnippets(db, first.conversationId, { firstSeq: 1, lastSeq: 4 });
      const forgetting = () => forgetPhrases(db, engram.services.deps, first.endUserId, ["badge"], reason);
      await Promise.all(i % 2 ? [indexing(), forgetting()] : [forgetting(), indexing()]);
      // Indexing that read the messages after the forget makes the replies' snippets ("Saved."),
      // which hold nothing forgotten; no snippet may hold a forgotten message or its words.
      const left = await db.recallSnippet.findMany({ where: { endUserId: first.endUserId }, select: { text: true, messageIds: true } });
      const live = new Set((await db.message.findMany({ where: { conversationId: first.conversationId }, select: { id: true } })).map((m) => m.id));
      expect(left.filter((s) => /badge/i.test(s.text) || s.messageIds.some((id) => !live.has(id)))).toEqual([]);
    }
  });
});

describe("a gate verdict of a message forgotten while it was judged", () => {
  it("is not stored by a follow-ups round that read the message before the forget", async () => {
    await keepMessages(true);
    const turn = await say(engram, { user: "uma", conversation: "uma-1" }, "My door code is 7741.", "Saved.");
    const other = await say(engram, { user: "uma", conversation: "uma-2" }, "I like aisle seats.", "Noted.");
    const opening = (conversationId: string) => db.message.findFirstOrThrow({ where: { conversationId, seq: 1 } });
    const [source, otherSource] = [await opening(turn.conversationId), await opening(other.conversationId)];
    const gate = await gateByKeywords(db, [
      { conversationId: turn.conversationId, message: source.content },
      { conversationId: other.conversationId, message: otherSource.content },
    ]);
    await forgetPhrases(db, engram.services.deps, turn.endUserId, ["door code"], reason);
    const [forgotten, kept] = gate.fresh.map(({ index: _, ...row }) => row);
    await takeFromOutbox(db, {
      turnIds: [turn.turnId, other.turnId],
      snippets: [],
      verdicts: [
        { ...forgotten, turnId: turn.turnId, messageId: source.id },
        { ...kept, turnId: other.turnId, messageId: otherSource.id },
      ],
      forgetting: [],
      gated: [],
    });
    expect(await db.gateVerdict.count({ where: { conversationId: turn.conversationId } })).toBe(0);
    expect(await db.gateVerdict.count({ where: { conversationId: other.conversationId } })).toBe(1);
  });

  it("is not stored by a turn's gate whose model call a forget ran during, and is still answered", async () => {
    await keepMessages(true);
    const turn = await say(engram, { user: "vic", conversation: "vic-1" }, "My bike lock code is 2290.", "Saved.");
    const source = await db.message.findFirstOrThrow({ where: { conversationId: turn.conversationId, seq: 1 } });
    const answer = { remember: true, forget: "NONE" as const, forgetTargets: [], needsRecall: false };
    const triage = RunnableLambda.from(async () => {
      await forgetPhrases(db, engram.services.deps, turn.endUserId, ["lock code"], reason);
      return answer;
    });
    const verdict = await gateMessage(db, { triage, log: engram.services.log }, { conversationId: turn.conversationId, messageId: source.id, message: source.content });
    expect(verdict).toEqual({ ...answer, decidedBy: "MODEL" });
    expect(await db.gateVerdict.count({ where: { conversationId: turn.conversationId } })).toBe(0);
  });
});

describe("the query vectors this instance kept", () => {
  it("of the tenant go with a forget: a message's vector is not answered from memory after it", async () => {
    const text = "What was the code to my storage unit again?";
    const { embeddings } = await engram.services.deps.embeddings.forTenant(engram.tenant.tenantId);
    const encoder = vi.spyOn(OfflineEmbeddings.prototype, "embedQuery");
    try {
      await embeddings.embedQuery(text);
      await embeddings.embedQuery(text);
      expect(encoder).toHaveBeenCalledTimes(1);
      const turn = await say(engram, { user: "wes", conversation: "wes-1" }, text, "4471.");
      await forgetUser(db, engram.services.deps, turn.endUserId, reason);
      await embeddings.embedQuery(text);
      expect(encoder).toHaveBeenCalledTimes(2);
    } finally {
      encoder.mockRestore();
    }
  });
});

/** The tenant's client with `turn.findMany` running `first` before its first call goes through. */
function onFirstTurnRead(first: () => Promise<unknown>): TenantDb {
  let ran = false;
  const turn = new Proxy(db.turn, {
    get: (target, prop) =>
      prop === "findMany"
        ? async (...args: Parameters<typeof target.findMany>) => {
            if (!ran) {
              ran = true;
              await first();
            }
            return target.findMany(...args);
          }
        : Reflect.get(target, prop),
  });
  return new Proxy(db, {
    get: (target, prop) => {
      if (prop === "turn") return turn;
      const value = Reflect.get(target, prop);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

describe("a dead letter of the user's work", () => {
  it("goes with forgetUser, as the job records do", async () => {
    const turn = await say(engram, { user: "ines", conversation: "ines-1" }, "Hello.", "Hi.");
    const tenantId = engram.tenant.tenantId;
    const letter = await engram.services.db.jobRun.create({
      data: { tenantId, name: "memory.turn", status: "FAILED", result: { deadLetter: true, tries: 5, conversationId: turn.conversationId, turnId: turn.turnId } },
    });
    const other = await engram.services.db.jobRun.create({ data: { tenantId, name: "memory.turn", status: "FAILED", result: { deadLetter: true, turnId: "elsewhere" } } });
    const receipt = await forgetUser(db, engram.services.deps, turn.endUserId, reason);
    expect(receipt.jobRecords).toBeGreaterThanOrEqual(1);
    expect(await engram.services.db.jobRun.count({ where: { id: { in: [letter.id, other.id] } } })).toBe(1);
  });
});

describe("deleteConversation", () => {
  it("deletes the facts extracted from its messages, and a fact or a verdict written from them while it runs", async () => {
    await keepMessages(false);
    const turn = await turnWithFactKey("xena", "My gym locker is 19.", "The user's gym locker is 19.");
    // After the delete's first look, the turn's work stores its gate verdict and another fact
    // from the same message.
    const meanwhile = onFirstTurnRead(async () => {
      await gateMessage(db, { triage: null, log: engram.services.log }, { conversationId: turn.conversationId, messageId: turn.sourceId, message: "My gym locker is 19." });
      await engram.services.db.fact.create({
        data: { tenantId: engram.tenant.tenantId, endUserId: turn.endUserId, text: "The user uses locker 19.", origin: "EXTRACTOR", sourceMessageId: turn.sourceId },
      });
    });
    const { receipt } = await forgetConversation(meanwhile, engram.services.deps, turn.conversationId, reason);
    expect(receipt.facts).toBe(2);
    expect(await db.fact.count({ where: { endUserId: turn.endUserId } })).toBe(0);
    expect(await db.gateVerdict.count({ where: { conversationId: turn.conversationId } })).toBe(0);
    expect(await vectorsOf(turn.endUserId)).not.toContain(turn.keyId);
  });
});

describe("deleteConversation and a summary accepted just before it", () => {
  it("leaves no vector of the summary's keys when they are written and indexed while it runs", async () => {
    const turn = await say(engram, { user: "ursa", conversation: "ursa-1" }, "My PIN is 8642.", "Saved.");
    await createTurnSnippets(db, turn.conversationId, { firstSeq: 1, lastSeq: 2 });
    // A rewrite accepted before the delete, whose job syncs and indexes the summary's keys after
    // its verbatim judge has answered: by then the delete has taken the messages and their snippets.
    await db.conversation.update({ where: { id: turn.conversationId }, data: { summary: "The user's PIN is 8642.", summaryThroughSeq: 2 } });
    let reads = 0;
    const meanwhile = afterFactsRead(async () => {
      if (++reads !== 2) return; // the second look, once the messages are gone
      const keys = await syncSummaryKeys(db, engram.services.deps, turn.conversationId);
      expect(keys).toHaveLength(1);
      await indexSnippets(db, engram.services.deps, keys);
    });
    await forgetConversation(meanwhile, engram.services.deps, turn.conversationId, reason);
    expect(reads).toBeGreaterThanOrEqual(2);
    expect(await snippetsOf(turn.endUserId)).toEqual([]);
    expect(await vectorsOf(turn.endUserId)).toEqual([]);
  });
});

describe("deleteFact and a summary rewrite committing at the same time", () => {
  // On the embedded store one session runs every statement in turn: no rewrite can commit while
  // the delete's clearing statement waits for the conversation's row.
  it.skipIf(!serverUrl)("leaves no revision of the rewrite that folded on from a summary holding the fact", async () => {
    const turn = await turnWithFactKey("vita", "My locker code is 7731.", "The user's locker code is 7731.");
    await say(engram, { user: "vita", conversation: "vita-1" }, "I also like tea.", "Noted.");
    const tenantId = engram.tenant.tenantId;
    const folded = "The user's locker code is 7731.";
    await db.conversation.update({ where: { id: turn.conversationId }, data: { summary: folded, summaryThroughSeq: 2 } });
    await db.summaryRevision.create({ data: { tenantId, conversationId: turn.conversationId, text: folded, words: 5, coveredThroughSeq: 2, accepted: true } });
    // A rewrite that started from that summary and folds the next turn: its transaction (summary.ts)
    // has moved the summary and written its revision, and commits once the delete waits for the row.
    let deleting: Promise<unknown> | undefined;
    await engram.services.db.$transaction(
      async (tx) => {
        const rewritten = `${folded} The user likes tea.`;
        await tx.conversation.updateMany({ where: { id: turn.conversationId, summary: folded }, data: { summary: rewritten, summaryThroughSeq: 4 } });
        await tx.summaryRevision.create({ data: { tenantId, conversationId: turn.conversationId, text: rewritten, words: 9, coveredThroughSeq: 4, accepted: true } });
        deleting = forgetFact(db, engram.services.deps, turn.factId, reason);
        await until("the delete to wait for the conversation's row", async () => {
          const [{ waiting }] = await engram.services.db.$queryRaw<{ waiting: number }[]>`
            SELECT count(*)::int AS "waiting" FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`;
          return waiting > 0;
        });
      },
      { timeout: 60_000 },
    );
    await deleting;
    expect(await db.conversation.findUniqueOrThrow({ where: { id: turn.conversationId } })).toMatchObject({ summary: null });
    expect(await db.summaryRevision.count({ where: { conversationId: turn.conversationId, text: { contains: "7731" } } })).toBe(0);
  });
});

describe("an extraction shown a fact that a forget deletes during its model call", () => {
  it("does not write that fact back from another message the batch holds, and reads the batch again", async () => {
    const said = await turnWithFactKey("rhea", "My address is 12 Quay Road.", "Rhea lives at 12 Quay Road.");
    await db.conversation.update({ where: { id: said.conversationId }, data: { extractedThroughSeq: 2 } });
    const later = await say(engram, { user: "rhea", conversation: "rhea-2" }, "Same building, but we are in flat 5 now.", "Noted.");
    const shown: string[][] = [];
    // The extractor combines what it was shown with the new message, as an update would; the
    // user asked to forget the address while it was asked.
    const extractor = RunnableLambda.from(async (input: { known: string[] }): Promise<CandidateFact[]> => {
      shown.push(input.known);
      if (shown.length === 1) await forgetPhrases(db, engram.services.deps, said.endUserId, ["Quay Road"], reason);
      return input.known.length ? [{ text: "Rhea lives at 12 Quay Road, flat 5.", core: true, seq: 1 }] : [];
    });
    const judge = RunnableLambda.from(async (): Promise<FactJudgment> => ({ durability: "durable", relation: "none", relatedFactId: null, sensitivity: null }));
    const deps = { ...engram.services.deps, extractor, judge };
    expect(await extractFacts(db, deps, later.conversationId, { now: true })).toMatchObject({ status: "BUSY" });
    expect(await db.fact.count({ where: { endUserId: said.endUserId } })).toBe(0);
    // Read again, with what is known now.
    expect(await extractFacts(db, deps, later.conversationId, { now: true })).toMatchObject({ status: "EXTRACTED" });
    expect(shown).toEqual([["Rhea lives at 12 Quay Road."], []]);
    expect(await db.fact.count({ where: { endUserId: said.endUserId } })).toBe(0);
  });
});

describe("another fact's history", () => {
  /** Two facts of a user, the second's history quoting the first (as a contradiction's does). */
  async function quotingPair(user: string) {
    const turn = await say(engram, { user, conversation: `${user}-1` }, "Hello.", "Hi.");
    const data = { tenantId: engram.tenant.tenantId, endUserId: turn.endUserId, origin: "API" };
    const quoted = await engram.services.db.fact.create({ data: { ...data, text: "The user's locker code is 5521." } });
    const quoting = await engram.services.db.fact.create({ data: { ...data, text: "The user has no locker any more." } });
    const version = { tenantId: data.tenantId, factId: quoting.id, text: quoting.text, core: false, change: "CONTRADICTED" } as const;
    await engram.services.db.factVersion.create({ data: { ...version, reason: `contradicts: ${quoted.text}` } });
    await engram.services.db.factVersion.create({ data: { ...version, reason: `contradiction resolved: both kept, with “${quoted.text}”` } });
    const reasons = async () => (await db.factVersion.findMany({ where: { factId: quoting.id } })).map((v) => v.reason);
    return { turn, quoted, quoting, reasons };
  }

  it("loses its quote of a fact \"forget my X\" deletes, and the fact stays", async () => {
    const pair = await quotingPair("yuri");
    await forgetPhrases(db, engram.services.deps, pair.turn.endUserId, ["locker code"], reason);
    expect(await db.fact.findUnique({ where: { id: pair.quoted.id } })).toBeNull();
    expect(await db.fact.findUnique({ where: { id: pair.quoting.id } })).not.toBeNull();
    expect(await pair.reasons()).toEqual(["(quoted a fact since forgotten)", "(quoted a fact since forgotten)"]);
  });

  it("loses its quote of a fact deleteFact deletes", async () => {
    const pair = await quotingPair("zara");
    await forgetFact(db, engram.services.deps, pair.quoted.id, reason);
    expect(await pair.reasons()).toEqual(["(quoted a fact since forgotten)", "(quoted a fact since forgotten)"]);
  });
});

describe("a summary's keys", () => {
  it("are not written when the summary is cleared between their read and their write", async () => {
    const turn = await say(engram, { user: "lux", conversation: "lux-1" }, "We are moving to Oslo in May.", "Exciting.");
    await createTurnSnippets(db, turn.conversationId, { firstSeq: 1, lastSeq: 2 });
    const summarize = (summary: string | null) => db.conversation.update({ where: { id: turn.conversationId }, data: { summary, summaryThroughSeq: 2 } });
    await summarize("The user is moving to Oslo in May.");
    expect(await syncSummaryKeys(db, engram.services.deps, turn.conversationId)).toHaveLength(1);
    // A new summary: its keys replace the old ones, and a forget clears it while they are made.
    await summarize("The user is moving to Oslo in May with two cats.");
    const deps = onFirstVectorDelete(() => summarize(null));
    expect(await syncSummaryKeys(db, deps, turn.conversationId)).toEqual([]);
    expect(await snippetsOf(turn.endUserId, "SUMMARY")).toEqual([]);
  });
});

describe("a fact's recall key", () => {
  it("goes from Chroma when forgetPhrases deletes the fact", async () => {
    const t = await turnWithFactKey("mira", "I drive a green Volvo.", "Mira drives a green Volvo.");
    const receipt = await forgetPhrases(db, engram.services.deps, t.endUserId, ["Volvo"], reason);
    // The turn's snippet and the fact's key.
    expect(receipt).toMatchObject({ facts: 1, snippets: 2 });
    expect(await vectorsOf(t.endUserId)).not.toContain(t.keyId);
    expect(await snippetsOf(t.endUserId, "FACT")).toEqual([]);
  });

  it("goes from Chroma when retention deletes the fact, and the turn it points to stays", async () => {
    const old = new Date(Date.now() - 40 * 86_400_000);
    const t = await turnWithFactKey("nico", "I play the cello.", "Nico plays the cello.", old);
    const [turnSnippet] = await snippetsOf(t.endUserId, "TURN");
    expect((await forgetExpired(db, engram.services.deps, new Date(Date.now() - 30 * 86_400_000), "retention")).facts).toBe(1);
    const left = await vectorsOf(t.endUserId);
    expect(left).not.toContain(t.keyId);
    expect(left).toContain(turnSnippet);
  });

  it("goes from Chroma when the user's cap of facts drops the fact", async () => {
    const old = new Date(Date.now() - 400 * 86_400_000);
    const t = await turnWithFactKey("oona", "I collect stamps.", "Oona collects stamps.", old);
    await engram.services.db.fact.createMany({
      data: Array.from({ length: 49 }, (_, i) => ({ tenantId: engram.tenant.tenantId, endUserId: t.endUserId, text: `Oona fact ${i}.`, origin: "API" as const })),
    });
    const added = await engram.gql(`mutation($input: AddFactInput!) { addFact(input: $input) { id } }`, { input: { endUserId: t.endUserId, text: "Oona likes tea." } });
    expect(added.errors).toBeUndefined();
    expect(await db.fact.count({ where: { id: t.factId } })).toBe(0);
    expect(await vectorsOf(t.endUserId)).not.toContain(t.keyId);
  });
});

describe("a forget while the vector store fails", () => {
  it("completes in the database, and owes the vector deletes to a job that makes them once the store answers", async () => {
    const t = await turnWithFactKey("vera", "My passport number is X1234567.", "Vera's passport number is X1234567.");
    const [turnSnippet] = await snippetsOf(t.endUserId, "TURN");
    const down: Deps = {
      ...engram.services.deps,
      vectors: { ...engram.services.deps.vectors, delete: () => Promise.reject(new Error("connect ECONNREFUSED 127.0.0.1:8000")) },
    };
    await forgetFact(db, down, t.factId, reason);
    // The fact, its key and the snippet of its message are gone, and the forget is audited: a retry has nothing left to do.
    expect(await db.fact.findUnique({ where: { id: t.factId } })).toBeNull();
    expect(await snippetsOf(t.endUserId)).toEqual([]);
    const audited = await db.auditLog.findMany({ where: { action: "memory.forget", changes: { path: ["target", "factId"], equals: t.factId } } });
    expect(audited).toHaveLength(1);
    // No search returns the vectors left behind (every hit is read back from its row).
    expect(await vectorsOf(t.endUserId)).toEqual(expect.arrayContaining([t.keyId, turnSnippet]));
    const { data } = await engram.gql(RECALL, { input: { endUserId: t.endUserId, text: "passport number", mode: "VECTOR" } });
    expect(data.recall.candidates).toEqual([]);
    // The deletes are owed as jobs (the worker is off here: they are run by hand), which take them all.
    const owed = await engram.services.db.$queryRaw<{ id: string; data: unknown }[]>`
      DELETE FROM "agenda_jobs" WHERE "name" = ${deleteVectorsJob.name} AND "data"->>'tenantId' = ${engram.tenant.tenantId} RETURNING "id", "data"`;
    expect(owed.length).toBeGreaterThan(0);
    for (const job of owed) await deleteOwedVectors(engram.services.deps, deleteVectorsJob.schema.parse(job.data));
    expect(await vectorsOf(t.endUserId)).toEqual([]);
  });
});

describe("\"forget my X\" matching a fact and not the message it came from", () => {
  it("forgets that message with the fact: no snippet, no vector, nothing recalled, and the fact is not written back from it", async () => {
    await keepMessages(true);
    const t = await turnWithFactKey("elm", "We just moved to 4 Elm Street and I started at Globex.", "Elm lives at 4 Elm Street.");
    // Another fact from the same message, which the phrase does not name: it goes with the message.
    const job = await db.fact.create({
      data: { tenantId: engram.tenant.tenantId, endUserId: t.endUserId, text: "Elm works at Globex.", origin: "EXTRACTOR", sourceMessageId: t.sourceId, confirmedAt: new Date() },
    });
    const [turnSnippet] = await snippetsOf(t.endUserId, "TURN");
    // "where I live" is the words `live`: the fact's, not the message's.
    const receipt = await forgetPhrases(db, engram.services.deps, t.endUserId, ["where I live"], reason);
    expect(receipt).toMatchObject({ facts: 2, snippets: 2 });
    expect(await snippetsOf(t.endUserId)).toEqual([]);
    expect(await db.fact.findUnique({ where: { id: job.id } })).toBeNull();
    expect(await vectorsOf(t.endUserId)).not.toContain(turnSnippet);
    expect((await db.message.findUniqueOrThrow({ where: { id: t.sourceId } })).forgottenAt).not.toBeNull();
    const { data } = await engram.gql(RECALL, { input: { endUserId: t.endUserId, text: "Elm Street", mode: "KEYWORD" } });
    expect(data.recall.candidates).toEqual([]);
    const again = await applyCandidate(db, engram.services.deps, {
      endUserId: t.endUserId,
      candidate: { text: "Elm lives at 4 Elm Street.", core: true, seq: 1 },
      judgment: { durability: "durable", relation: "none", relatedFactId: null, sensitivity: null },
      allowSensitive: true,
      sourceMessageId: t.sourceId,
      conversationId: t.conversationId,
    });
    expect(again).toMatchObject({ change: "DROPPED", factId: null });
  });

  it("matches a snippet by its words, not by the date words it is also indexed under", async () => {
    const turn = await say(engram, { user: "wed", conversation: "wed-1" }, "I bought a new kettle.", "Nice.");
    await createTurnSnippets(db, turn.conversationId, { firstSeq: 1, lastSeq: 2 });
    // Its snippet is indexed under the day it was said ("Monday", say), which its text does not say.
    const weekday = new Date().toLocaleDateString("en-US", { weekday: "long", timeZone: "UTC" });
    const receipt = await forgetPhrases(db, engram.services.deps, turn.endUserId, [weekday], reason);
    expect(receipt).toMatchObject({ snippets: 0, messages: 0 });
    expect(await snippetsOf(turn.endUserId, "TURN")).toHaveLength(1);
  });
});

describe("a fact updated from a later message", () => {
  /** A fact the extractor read from one turn, then updated from a turn of another conversation: each version names its message. */
  async function updatedFact(user: string, first: [message: string, fact: string], second: [message: string, fact: string]) {
    const turns: { endUserId: string; conversationId: string; sourceId: string }[] = [];
    for (const [i, [message]] of [first, second].entries()) {
      const turn = await say(engram, { user, conversation: `${user}-${i + 1}` }, message, "Noted.");
      await createTurnSnippets(db, turn.conversationId, { firstSeq: 1, lastSeq: 2 });
      const source = await db.message.findFirstOrThrow({ where: { conversationId: turn.conversationId, seq: 1 } });
      turns.push({ ...turn, sourceId: source.id });
    }
    const judged = (relation: "none" | "update", relatedFactId: string | null) => ({ durability: "durable" as const, relation, relatedFactId, sensitivity: null });
    const apply = (i: number, fact: string, relation: "none" | "update", relatedFactId: string | null) =>
      applyCandidate(db, engram.services.deps, {
        endUserId: turns[i].endUserId,
        candidate: { text: fact, core: true, seq: 1 },
        judgment: judged(relation, relatedFactId),
        allowSensitive: true,
        sourceMessageId: turns[i].sourceId,
        conversationId: turns[i].conversationId,
      });
    const added = await apply(0, first[1], "none", null);
    const updated = await apply(1, second[1], "update", added.factId);
    expect(updated).toMatchObject({ change: "UPDATED", factId: added.factId });
    const versions = await db.factVersion.findMany({ where: { factId: added.factId! }, select: { change: true, sourceMessageId: true } });
    expect(versions).toHaveLength(2);
    expect(versions).toEqual(
      expect.arrayContaining([
        { change: "ADDED", sourceMessageId: turns[0].sourceId },
        { change: "UPDATED", sourceMessageId: turns[1].sourceId },
      ]),
    );
    return { endUserId: turns[0].endUserId, factId: added.factId!, sources: turns.map((t) => t.sourceId), conversationIds: turns.map((t) => t.conversationId) };
  }
  const historyOf = (factId: string) => db.factVersion.findMany({ where: { factId }, orderBy: { createdAt: "asc" }, select: { text: true, reason: true } });

  it("deleted (deleteFact): the messages of its earlier versions go from recall too, and no fact is written from them again", async () => {
    await keepMessages(false);
    const t = await updatedFact("oak", ["We live at 4 Elm Street.", "Oak lives at 4 Elm Street."], ["We moved to 9 Birch Road.", "Oak lives at 9 Birch Road."]);
    // Each version names its message in the API too.
    const history = await engram.gql(`query($id: ID!) { factHistory(factId: $id) { change sourceMessage { id content } } }`, { id: t.factId });
    expect(history.data.factHistory).toHaveLength(2);
    expect(history.data.factHistory).toEqual(
      expect.arrayContaining([
        { change: "ADDED", sourceMessage: { id: t.sources[0], content: "We live at 4 Elm Street." } },
        { change: "UPDATED", sourceMessage: { id: t.sources[1], content: "We moved to 9 Birch Road." } },
      ]),
    );
    await forgetFact(db, engram.services.deps, t.factId, reason);
    expect(await snippetsOf(t.endUserId, "TURN")).toEqual([]);
    const { data } = await engram.gql(RECALL, { input: { endUserId: t.endUserId, text: "Elm Street", mode: "KEYWORD" } });
    expect(data.recall.candidates).toEqual([]);
    // The messages stay, marked: deleteFact deletes what was drawn from them, not what was said.
    const messages = await db.message.findMany({ where: { id: { in: t.sources } }, select: { factsForgottenAt: true } });
    expect(messages).toHaveLength(2);
    expect(messages.every((m) => m.factsForgottenAt !== null)).toBe(true);
  });

  it("deleted while an extraction updates it from a third message: that message is marked and leaves recall too", async () => {
    await keepMessages(false);
    const t = await updatedFact("ash", ["We live at 4 Elm Street.", "Ash lives at 4 Elm Street."], ["We moved to 9 Birch Road.", "Ash lives at 9 Birch Road."]);
    const third = await say(engram, { user: "ash", conversation: "ash-3" }, "Now we are at 12 Cedar Lane.", "Noted.");
    await createTurnSnippets(db, third.conversationId, { firstSeq: 1, lastSeq: 2 });
    const source = await db.message.findFirstOrThrow({ where: { conversationId: third.conversationId, seq: 1 } });
    // The update commits after the delete read the fact's messages and before it locks the fact.
    let ran = false;
    const updateMeanwhile = () =>
      applyCandidate(db, engram.services.deps, {
        endUserId: t.endUserId,
        candidate: { text: "Ash lives at 12 Cedar Lane.", core: true, seq: 1 },
        judgment: { durability: "durable", relation: "update", relatedFactId: t.factId, sensitivity: null },
        allowSensitive: true,
        sourceMessageId: source.id,
        conversationId: third.conversationId,
      });
    const racing = afterFactsRead(async () => {
      if (ran) return;
      ran = true;
      expect(await updateMeanwhile()).toMatchObject({ change: "UPDATED" });
    });
    await forgetFact(racing, engram.services.deps, t.factId, reason);
    expect(ran).toBe(true);
    expect(await db.fact.count({ where: { endUserId: t.endUserId } })).toBe(0);
    expect((await db.message.findUniqueOrThrow({ where: { id: source.id } })).factsForgottenAt).not.toBeNull();
    expect(await snippetsOf(t.endUserId, "TURN")).toEqual([]);
  });

  it("stays when the conversation of an earlier version is deleted; that version, and its quote, go", async () => {
    const t = await updatedFact("fir", ["We live at 4 Elm Street.", "Fir lives at 4 Elm Street."], ["We moved to 9 Birch Road.", "Fir lives at 9 Birch Road."]);
    const { receipt } = await forgetConversation(db, engram.services.deps, t.conversationIds[0], reason);
    expect(receipt).toMatchObject({ facts: 0, factVersions: 1 });
    expect(await db.fact.findUniqueOrThrow({ where: { id: t.factId } })).toMatchObject({ text: "Fir lives at 9 Birch Road." });
    expect(await historyOf(t.factId)).toEqual([{ text: "Fir lives at 9 Birch Road.", reason: "(quoted a fact since forgotten)" }]);
  });

  it("keeps a quote of that version's text while another of the user's facts still says it", async () => {
    const t = await updatedFact("rue", ["I only drink tea.", "Rue drinks tea."], ["I switched to coffee.", "Rue drinks coffee."]);
    await db.fact.create({ data: { tenantId: engram.tenant.tenantId, endUserId: t.endUserId, text: "Rue drinks tea.", origin: "PERSON" } });
    await forgetConversation(db, engram.services.deps, t.conversationIds[0], reason);
    expect(await historyOf(t.factId)).toEqual([{ text: "Rue drinks coffee.", reason: "replaces: Rue drinks tea." }]);
  });

  it("stays when \"forget my X\" takes an earlier version's message by the message's own words; that version, and its quote, go", async () => {
    await keepMessages(true);
    const t = await updatedFact("larch", ["Our place near the harbour has a blue gate.", "Larch lives by the sea."], ["We moved inland to Boulder.", "Larch lives in Boulder."]);
    const receipt = await forgetPhrases(db, engram.services.deps, t.endUserId, ["harbour"], reason);
    expect(receipt).toMatchObject({ facts: 0, factVersions: 1 });
    expect((await db.message.findUniqueOrThrow({ where: { id: t.sources[0] } })).forgottenAt).not.toBeNull();
    expect(await historyOf(t.factId)).toEqual([{ text: "Larch lives in Boulder.", reason: "(quoted a fact since forgotten)" }]);
  });

  it("matched by \"forget my X\" only in its history: the message that version was read from goes too", async () => {
    await keepMessages(false);
    const t = await updatedFact("pine", ["Our flat overlooks the boats now.", "Pine lives near the harbour."], ["We moved to Oslo centre.", "Pine lives in Oslo centre."]);
    // "harbour" is in the first version's words only: not the message's, not the fact's current text.
    const receipt = await forgetPhrases(db, engram.services.deps, t.endUserId, ["harbour"], reason);
    expect(receipt).toMatchObject({ facts: 1, messages: 1 });
    expect(await db.message.count({ where: { id: t.sources[0] } })).toBe(0);
    expect(await db.message.count({ where: { id: t.sources[1] } })).toBe(1);
    const { data } = await engram.gql(RECALL, { input: { endUserId: t.endUserId, text: "boats", mode: "KEYWORD" } });
    expect(data.recall.candidates).toEqual([]);
  });
});

describe("a fact extracted from a message forgotten while the extraction ran", () => {
  it("is dropped, and a forget that finds it written sweeps it", async () => {
    await keepMessages(true);
    const turn = await say(engram, { user: "pia", conversation: "pia-1" }, "I am allergic to penicillin.", "Noted.");
    const source = await db.message.findFirstOrThrow({ where: { conversationId: turn.conversationId, seq: 1 } });
    // Its snippet is what the first sweep finds: the extraction writes its fact meanwhile.
    await createTurnSnippets(db, turn.conversationId, { firstSeq: 1, lastSeq: 2 });
    const candidate = (sourceMessageId: string) =>
      applyCandidate(db, engram.services.deps, {
        endUserId: turn.endUserId,
        candidate: { text: "Pia is allergic to penicillin.", core: true, seq: 1 },
        judgment: { durability: "durable", relation: "none", relatedFactId: null, sensitivity: null },
        allowSensitive: true,
        sourceMessageId,
        conversationId: turn.conversationId,
      });
    // Written after the forget's first delete of facts, before its messages are marked: swept.
    const deps = onFirstVectorDelete(() => candidate(source.id));
    const receipt = await forgetPhrases(db, deps, turn.endUserId, ["penicillin"], reason);
    expect(receipt.facts).toBe(1);
    expect(await db.fact.count({ where: { endUserId: turn.endUserId } })).toBe(0);
    // Written after the forget: the message is forgotten, so the fact is not.
    expect(await candidate(source.id)).toMatchObject({ change: "DROPPED", factId: null });
    expect(await db.fact.count({ where: { endUserId: turn.endUserId } })).toBe(0);
  });

  /**
   * Two turns read as one extraction batch ("My locker code is …", then "It is also my gym
   * code."), and `meanwhile` run on the first message before the candidate drawn from it, citing
   * the second (seq 3), is applied.
   */
  async function citingTheNext(user: string, code: number, meanwhile: (turn: { endUserId: string }, first: { id: string }) => Promise<unknown>) {
    const turn = await say(engram, { user, conversation: `${user}-1` }, `My locker code is ${code}.`, "Noted.");
    await say(engram, { user, conversation: `${user}-1` }, "It is also my gym code.", "Got it.");
    const batch = await db.message.findMany({ where: { conversationId: turn.conversationId }, orderBy: { seq: "asc" } });
    await meanwhile(turn, batch[0]);
    const outcome = await applyCandidate(db, engram.services.deps, {
      endUserId: turn.endUserId,
      candidate: { text: `The user's locker code ${code} is also their gym code.`, core: false, seq: 3 },
      judgment: { durability: "durable", relation: "none", relatedFactId: null, sensitivity: null },
      allowSensitive: true,
      sourceMessageId: batch[2].id,
      readMessageIds: batch.map((m) => m.id),
      conversationId: turn.conversationId,
    });
    return { turn, outcome };
  }

  it("is dropped when it cites another message of the batch the extraction read", async () => {
    await keepMessages(true);
    // Drawn from the forgotten message, citing the next one, which was not forgotten.
    const { turn, outcome } = await citingTheNext("quin", 3141, (t) => forgetPhrases(db, engram.services.deps, t.endUserId, ["locker code"], reason));
    expect(outcome).toMatchObject({ change: "DROPPED", factId: null });
    expect(await db.fact.count({ where: { endUserId: turn.endUserId } })).toBe(0);
  });

  it("is dropped when a fact from another message of the batch was deleted meanwhile (deleteFact)", async () => {
    const { outcome } = await citingTheNext("rhea", 2718, async (t, first) => {
      const deleted = await engram.services.db.fact.create({
        data: { tenantId: engram.tenant.tenantId, endUserId: t.endUserId, text: "The user's locker code is 2718.", origin: "EXTRACTOR", sourceMessageId: first.id },
      });
      await forgetFact(db, engram.services.deps, deleted.id, reason);
    });
    expect(outcome).toMatchObject({ change: "DROPPED", factId: null });
  });
});

describe("a vector whose snippet is gone", () => {
  // An index job upserted the vector of a snippet it had read, a forget deleted the row meanwhile,
  // and the job died (or Chroma failed its delete) before it took the vector back out.
  const orphan = async (user: string, message: string) => {
    const turn = await say(engram, { user, conversation: `${user}-1` }, message, "Noted.");
    const [snippetId] = await createTurnSnippets(db, turn.conversationId, { firstSeq: 1, lastSeq: 2 });
    await indexSnippets(db, engram.services.deps, [snippetId]);
    await db.recallSnippet.delete({ where: { id: snippetId } });
    expect(await vectorsOf(turn.endUserId)).toEqual([snippetId]);
    return { ...turn, snippetId };
  };

  it("is taken out by the job's retry", async () => {
    const turn = await orphan("quin", "My locker is number 42.");
    expect(await indexSnippets(db, engram.services.deps, [turn.snippetId])).toEqual({ indexed: 0 });
    expect(await vectorsOf(turn.endUserId)).toEqual([]);
  });

  it("is taken out by reconcile's sweep, and a vector with its snippet stays", async () => {
    const turn = await orphan("rhys", "My bank PIN is 9090.");
    const kept = await say(engram, { user: "rhys", conversation: "rhys-2" }, "I like long walks.", "Nice.");
    const [keptId] = await createTurnSnippets(db, kept.conversationId, { firstSeq: 1, lastSeq: 2 });
    await indexSnippets(db, engram.services.deps, [keptId]);
    await reconcileRecall(engram.services.deps, { tenantId: engram.tenant.tenantId }, { graceMs: 0 });
    expect(await vectorsOf(turn.endUserId)).toEqual([keptId]);
  });
});

describe("a fact deleted while an extraction that read its message runs", () => {
  const candidate = (t: { endUserId: string; conversationId: string; sourceId: string }, text: string) =>
    applyCandidate(db, engram.services.deps, {
      endUserId: t.endUserId,
      candidate: { text, core: true, seq: 1 },
      judgment: { durability: "durable", relation: "none", relatedFactId: null, sensitivity: null },
      allowSensitive: true,
      sourceMessageId: t.sourceId,
      conversationId: t.conversationId,
    });

  it("is not written back from that message, during the delete or after it; the message stays", async () => {
    await keepMessages(false);
    const t = await turnWithFactKey("sami", "I am vegetarian.", "Sami is vegetarian.");
    // The extraction's write lands inside the delete (its first vector delete runs it first).
    await forgetFact(db, onFirstVectorDelete(() => candidate(t, "Sami is vegetarian.")), t.factId, reason);
    expect(await db.fact.count({ where: { endUserId: t.endUserId } })).toBe(0);
    expect(await candidate(t, "Sami does not eat meat.")).toMatchObject({ change: "DROPPED", factId: null });
    expect(await db.fact.count({ where: { endUserId: t.endUserId } })).toBe(0);
    expect(await db.message.count({ where: { id: t.sourceId } })).toBe(1);
  });

  it("leaves no fact from that message when the two run at once (8 times, in either order)", async () => {
    for (let round = 0; round < 8; round++) {
      const t = await turnWithFactKey(`tove-${round}`, "I live in Oslo.", "Tove lives in Oslo.");
      const write = () => candidate(t, "Tove lives in Oslo.");
      const remove = () => forgetFact(db, engram.services.deps, t.factId, reason);
      await Promise.all(round % 2 ? [write(), remove()] : [remove(), write()]);
      expect(await db.fact.count({ where: { sourceMessageId: t.sourceId } })).toBe(0);
      expect(await candidate(t, "Tove lives in Oslo.")).toMatchObject({ change: "DROPPED" });
    }
  });
});

describe("a fact deleted while its turn's indexing is queued or running", () => {
  /** A turn not indexed yet (its job still queued), and a fact extraction drew from its user message. */
  async function factOfUnindexedTurn(user: string, message: string, fact: string) {
    const turn = await say(engram, { user, conversation: `${user}-1` }, message, "Noted.");
    const source = await db.message.findFirstOrThrow({ where: { conversationId: turn.conversationId, seq: 1 } });
    const made = await db.fact.create({ data: { tenantId: engram.tenant.tenantId, endUserId: turn.endUserId, text: fact, origin: "EXTRACTOR", sourceMessageId: source.id } });
    return { ...turn, factId: made.id, sourceId: source.id };
  }
  const recalled = async (endUserId: string, text: string) =>
    (await engram.gql(RECALL, { input: { endUserId, text } })).data.recall.candidates.map((c: { text: string }) => c.text);
  it("is not brought back by the job run after the delete: no snippet of its turn, no key, nothing recalled", async () => {
    const t = await factOfUnindexedTurn("vera", "My passport number is QX81234.", "Vera's passport number is QX81234.");
    await forgetFact(db, engram.services.deps, t.factId, reason);
    await runIndexSnippets(db, engram.services.deps, { tenantId: engram.tenant.tenantId, conversationId: t.conversationId, firstSeq: 1, lastSeq: 2 });
    expect(await snippetsOf(t.endUserId)).toEqual([]);
    expect(await vectorsOf(t.endUserId)).toEqual([]);
    expect(await recalled(t.endUserId, "what is my passport number?")).toEqual([]);
    // The message itself stays (deleteFact deletes what was drawn from it, not what was said).
    expect(await db.message.count({ where: { id: t.sourceId } })).toBe(1);
  });

  it("is not written by a snippet insert planned before the delete", async () => {
    const t = await factOfUnindexedTurn("wren", "My blood type is AB negative.", "Wren's blood type is AB negative.");
    const plan = await planSnippetsOfTurns(db, [{ conversationId: t.conversationId, endUserId: t.endUserId, firstSeq: 1, lastSeq: 2 }]);
    expect(plan.rows).toHaveLength(1);
    await forgetFact(db, engram.services.deps, t.factId, reason);
    const inserted = await db.$queryRaw<{ id: string }[]>`
      WITH ${insertTurnSnippets(engram.tenant.tenantId, plan.rows.map(({ turn: _, ...row }) => row))} SELECT "id" FROM "inserted"`;
    expect(inserted).toEqual([]);
    expect(await snippetsOf(t.endUserId)).toEqual([]);
  });

  for (const via of ["deleteFact", "retention"] as const) {
    it(`has no key written by a key sync that read it before the delete (${via}), and recall does not find it`, async () => {
      const old = new Date(Date.now() - 40 * 86_400_000);
      const t = await factOfUnindexedTurn(`xan-${via}`, "I sleep with a night light on.", "Xan sleeps with a night light on.");
      if (via === "retention") await db.fact.update({ where: { id: t.factId }, data: { confirmedAt: old } });
      const [turnSnippet] = await createTurnSnippets(db, t.conversationId, { firstSeq: 1, lastSeq: 2 });
      await indexSnippets(db, engram.services.deps, [turnSnippet]);
      const remove = () =>
        via === "deleteFact"
          ? forgetFact(db, engram.services.deps, t.factId, reason)
          : forgetExpired(db, engram.services.deps, new Date(Date.now() - 30 * 86_400_000), "retention");
      const keys = await syncFactKeys(afterFactsRead(remove), engram.services.deps, t.endUserId);
      expect(keys).toEqual([]);
      await indexSnippets(db, engram.services.deps, keys);
      expect(await snippetsOf(t.endUserId, "FACT")).toEqual([]);
      expect(await vectorsOf(t.endUserId)).toEqual(via === "deleteFact" ? [] : [turnSnippet]);
      expect((await recalled(t.endUserId, "night light")).filter((text: string) => text === "Xan sleeps with a night light on.")).toEqual([]);
    });
  }

  it("leaves neither a key nor its vector when the key's sync and indexing run at once with the delete (8 times, in either order)", async () => {
    for (let round = 0; round < 8; round++) {
      const t = await factOfUnindexedTurn(`yara-${round}`, "I keep bees on my roof.", "Yara keeps bees on her roof.");
      const [turnSnippet] = await createTurnSnippets(db, t.conversationId, { firstSeq: 1, lastSeq: 2 });
      await indexSnippets(db, engram.services.deps, [turnSnippet]);
      const index = async () => indexSnippets(db, engram.services.deps, await syncFactKeys(db, engram.services.deps, t.endUserId));
      const remove = () => forgetFact(db, engram.services.deps, t.factId, reason);
      await Promise.all(round % 2 ? [index(), remove()] : [remove(), index()]);
      expect(await snippetsOf(t.endUserId)).toEqual([]);
      expect(await vectorsOf(t.endUserId)).toEqual([]);
    }
  });
});
