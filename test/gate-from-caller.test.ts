import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { gateVerdictJsonSchema, gateVerdictSchema } from "../src/chains/triage.ts";
import { forTenant } from "../src/db.ts";
import { needsRecallByKeywords } from "../src/memory/gate/keywords.ts";
import { OfflineEmbeddings } from "../src/embeddings/offline.ts";
import { runIndexSnippets } from "../src/work/index-snippets.ts";
import { runTurnWork } from "../src/work/turn-work.ts";
import { GateInstructionsDocument, RecallIndexStatusDocument } from "../src/gql/graphql.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ChatRequest, ModelServer } from "./helpers/model-server.ts";
import { factsScript, rerankSnippets } from "./helpers/scripted-memory-model.ts";

const RECORD = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { id firstSeq lastSeq conversation { id endUser { id } } } }`;
const CONTEXT = `query($input: ContextInput!) { context(input: $input) { conversationId blocks { kind text } } }`;
const RECALL = `query($input: RecallInput!) { recall(input: $input) { candidates { snippetId indexedAt } } }`;

const gateAndFacts = factsScript({ triage: (m) => ({ remember: /^I /.test(m), needsRecall: false }) });
const isRerank = (r: ChatRequest) => r.chain === "rerank";
const chainOf = (r: ChatRequest) => r.chain;

let model: ModelServer;
let engram: TestEngram;
beforeAll(async () => {
  // A scripted chat model on loopback (gate, extraction, re-rank) and the offline encoder, which
  // has a measured recall-intent threshold.
  ({ model, engram } = await startEngramWithModel({
    respond: (request) =>
      isRerank(request)
        ? JSON.stringify({ scores: rerankSnippets(request).map(({ id, text }) => ({ id, score: /Nonna|Pepper/.test(text) ? 3 : 0 })) })
        : gateAndFacts(request),
    env: { ENGRAM_EMBEDDINGS: "offline" },
  }));
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

const db = () => forTenant(engram.services.db, engram.tenant.tenantId);
const chatCalls = (chain?: string) => model.requests.filter((r) => (chain ? chainOf(r) === chain : true)).length;
const verdictsOf = (conversationId: string) => engram.services.db.gateVerdict.findMany({ where: { conversationId } });

let n = 0;
async function record(who: { user: string; conversation: string }, userMessage: string, gate?: unknown) {
  const result = await engram.gql(RECORD, {
    input: {
      agentExternalId: "shop",
      endUserExternalId: who.user,
      conversationExternalId: who.conversation,
      clientTurnId: `gate-${++n}`,
      userMessage,
      assistantMessage: `Answer ${n}.`,
      ...(gate === undefined ? {} : { gate }),
    },
  });
  return result;
}
async function recorded(who: { user: string; conversation: string }, userMessage: string, gate?: unknown) {
  const { data, errors } = await record(who, userMessage, gate);
  expect(errors).toBeUndefined();
  const turn = data.recordTurn;
  return { ...turn, conversationId: turn.conversation.id as string, endUserId: turn.conversation.endUser.id as string };
}
/** The turn's background work and its indexing, run now (the test has no worker). */
async function followUps(turn: { id: string; conversationId: string; firstSeq: number; lastSeq: number }) {
  const work = await runTurnWork(db(), engram.services.deps, { tenantId: engram.tenant.tenantId, turnId: turn.id });
  await runIndexSnippets(db(), engram.services.deps, {
    tenantId: engram.tenant.tenantId,
    conversationId: turn.conversationId,
    firstSeq: turn.firstSeq,
    lastSeq: turn.lastSeq,
  });
  return work;
}

describe("gateInstructions", () => {
  it("serves the prompt fragment and the JSON schema derived from the verdict's zod schema", async () => {
    const { data, errors } = await engram.gql(GateInstructionsDocument, {}, engram.tenant.reader);
    expect(errors).toBeUndefined();
    const { prompt, jsonSchema, toolName } = data.gateInstructions;
    expect(prompt).toContain("needsRecall: does answering need earlier conversations");
    expect(toolName).toBe("engram_gate");
    expect(jsonSchema).toEqual(gateVerdictJsonSchema());
    expect(jsonSchema).toMatchObject({
      type: "object",
      additionalProperties: false,
      required: expect.arrayContaining(["remember", "forget", "forgetTargets", "needsRecall"]),
      properties: { forget: { enum: ["NONE", "SOME", "ALL"] }, remember: { type: "boolean" }, needsRecall: { type: "boolean" } },
    });
    // What the schema describes is what context and recordTurn accept.
    expect(gateVerdictSchema.safeParse({ remember: true, forget: "NONE", forgetTargets: [], needsRecall: false }).success).toBe(true);
  });
});

describe("a verdict from the caller", () => {
  it("recordTurn stores it as the turn's verdict and the background work makes no gate call", async () => {
    const gatesBefore = chatCalls("triage");
    const turn = await recorded({ user: "uma", conversation: "uma-1" }, "I am moving to Oslo in May.", {
      remember: true,
      forget: "NONE",
      forgetTargets: [],
      needsRecall: false,
    });
    expect(await verdictsOf(turn.conversationId)).toMatchObject([{ decidedBy: "CALLER", remember: true, needsRecall: false }]);
    const work = await followUps(turn);
    expect(work).toMatchObject({ status: "DONE", verdict: { decidedBy: "CALLER", remember: true } });
    expect(chatCalls("triage")).toBe(gatesBefore);
    expect(chatCalls("extract")).toBeGreaterThan(0);
  });

  it("a verdict that does not fit the schema is BAD_USER_INPUT, and nothing is written", async () => {
    for (const gate of [{ remember: "yes", forget: "NONE", needsRecall: false }, { remember: true, forget: "MAYBE", needsRecall: false }, { remember: true, forget: "NONE" }, "forget it"]) {
      const { errors } = await record({ user: "val", conversation: "val-1" }, "Hello there", gate);
      expect(errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
      const ctx = await engram.gql(CONTEXT, { input: { conversationId: "nope", message: "hi", gate } });
      expect(ctx.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    }
    expect(await engram.services.db.conversation.count({ where: { externalId: "val-1" } })).toBe(0);
  });

  it("on context, it decides recall and is kept for the turn; the background gate does not overwrite it", async () => {
    const who = { user: "wes", conversation: "wes-1" };
    const earlier = await recorded(who, "Please book the corner table at Nonna's for Friday.");
    await followUps(earlier);
    const now = { user: "wes", conversation: "wes-2" };
    const first = await recorded(now, "Hi again.");
    await followUps(first);

    // No keyword and nothing like a recall prototype, but the caller's model says recall.
    const message = "Nonna's table for Friday, could you check it?";
    const chatBefore = chatCalls();
    const { data, errors } = await engram.gql(CONTEXT, {
      input: { conversationId: first.conversationId, message, gate: { remember: false, forget: "NONE", needsRecall: true } },
    });
    expect(errors).toBeUndefined();
    expect(data.context.blocks.find((b: { kind: string }) => b.kind === "RECALL")?.text).toContain("corner table at Nonna's");
    expect(model.requests.slice(chatBefore).map(chainOf)).not.toContain("triage");
    expect(await verdictsOf(first.conversationId)).toContainEqual(expect.objectContaining({ decidedBy: "CALLER", needsRecall: true }));

    // The turn is recorded without a verdict: the stored one is the caller's, and stays.
    const turn = await recorded(now, message);
    const work = await followUps(turn);
    expect(work).toMatchObject({ verdict: { decidedBy: "CALLER", needsRecall: true } });
    expect(model.requests.slice(chatBefore).map(chainOf)).not.toContain("triage");
  });

  it("from a reader key, it decides recall for that answer only: it is not kept, so it cannot steer the turn's work to forget", async () => {
    const who = { user: "yan", conversation: "yan-1" };
    const first = await recorded(who, "I like the corner table at Nonna's.");
    await followUps(first);
    const { data, errors } = await engram.gql(
      CONTEXT,
      { input: { conversationId: first.conversationId, message: "Thanks!", gate: { remember: false, forget: "ALL", forgetTargets: [], needsRecall: false } } },
      engram.tenant.reader,
    );
    expect(errors).toBeUndefined();
    expect(data.context.blocks.map((b: { kind: string }) => b.kind)).not.toContain("RECALL");
    expect(await verdictsOf(first.conversationId)).not.toContainEqual(expect.objectContaining({ decidedBy: "CALLER" }));
    // The turn that follows is judged by the turn's own gate, and nothing is forgotten.
    const turn = await recorded(who, "Thanks!");
    const work = await followUps(turn);
    expect(work).toMatchObject({ verdict: { forget: "NONE" } });
    expect(await engram.services.db.message.count({ where: { conversationId: first.conversationId } })).toBe(4);
  });

  it("a caller's needsRecall: false is obeyed even when keywords would recall", async () => {
    const turn = await recorded({ user: "wes", conversation: "wes-3" }, "Hello.");
    const { data } = await engram.gql(CONTEXT, {
      input: { conversationId: turn.conversationId, message: "Same as last time please", gate: { remember: false, forget: "NONE", needsRecall: false } },
    });
    expect(data.context.blocks.map((b: { kind: string }) => b.kind)).not.toContain("RECALL");
  });
});

describe("without a verdict", () => {
  it("context calls no chat model and stores nothing; the model gate runs after the reply", async () => {
    const turn = await recorded({ user: "xia", conversation: "xia-1" }, "Hello.");
    await followUps(turn);
    const before = chatCalls();
    const message = "What is the capital of Australia?";
    const { errors } = await engram.gql(CONTEXT, { input: { conversationId: turn.conversationId, message } });
    expect(errors).toBeUndefined();
    expect(chatCalls()).toBe(before);
    const stored = await verdictsOf(turn.conversationId);
    const next = await recorded({ user: "xia", conversation: "xia-1" }, message);
    expect((await verdictsOf(turn.conversationId)).length).toBe(stored.length);
    const work = await followUps(next);
    expect(work).toMatchObject({ verdict: { decidedBy: "MODEL" } });
    expect(chatCalls("triage")).toBeGreaterThan(0);
  });

  it("a message like the recall prototypes gets recall with no keyword, embedding the message once", async () => {
    const old = await recorded({ user: "yan", conversation: "yan-1" }, "My dog is called Pepper and she is a beagle.");
    await followUps(old);
    const turn = await recorded({ user: "yan", conversation: "yan-2" }, "Hello.");
    await followUps(turn);
    // Warm the prototypes' cache first: they are embedded once per embedder, not per message.
    await engram.gql(CONTEXT, { input: { conversationId: turn.conversationId, message: "Good morning" } });

    const embedQuery = vi.spyOn(OfflineEmbeddings.prototype, "embedQuery");
    const embedDocuments = vi.spyOn(OfflineEmbeddings.prototype, "embedDocuments");
    try {
      const before = chatCalls("triage");
      const { data, errors } = await engram.gql(CONTEXT, {
        input: { conversationId: turn.conversationId, message: "What is my dog called?" },
      });
      expect(errors).toBeUndefined();
      expect(data.context.blocks.find((b: { kind: string }) => b.kind === "RECALL")?.text).toContain("Pepper");
      expect(embedQuery).toHaveBeenCalledTimes(1);
      // embedQuery goes through embedDocuments once; nothing else was embedded.
      expect(embedDocuments).toHaveBeenCalledTimes(1);
      expect(chatCalls("triage")).toBe(before);
    } finally {
      embedQuery.mockRestore();
      embedDocuments.mockRestore();
    }
  });
  it("a message nearer the no-recall prototypes gets no recall, even when a keyword matches", async () => {
    const old = await recorded({ user: "zed", conversation: "zed-1" }, "My cat is called Pepper and I sort my pandas DataFrame columns by date.");
    await followUps(old);
    const turn = await recorded({ user: "zed", conversation: "zed-2" }, "Hello.");
    await followUps(turn);
    const recallBlock = async (message: string) => {
      const { data, errors } = await engram.gql(CONTEXT, { input: { conversationId: turn.conversationId, message } });
      expect(errors).toBeUndefined();
      return data.context.blocks.find((b: { kind: string }) => b.kind === "RECALL");
    };
    // "reorder" is one of the keyword patterns; the question is a general one all the same.
    const message = "How do I reorder columns in a pandas DataFrame?";
    expect(needsRecallByKeywords(message)).toBe(true);
    expect(await recallBlock(message)).toBeUndefined();
    expect(await recallBlock("Okay, thanks!")).toBeUndefined();
    // The same user asking for what they told before gets it.
    expect((await recallBlock("What is my cat called again?"))?.text).toContain("Pepper");
  });
});

describe("context by external ids", () => {
  const ids = (conversation: string, user = "zoe", agent = "shop") => ({
    agentExternalId: agent,
    endUserExternalId: user,
    conversationExternalId: conversation,
  });

  it("answers the same context as by conversationId", async () => {
    const turn = await recorded({ user: "zoe", conversation: "zoe-1" }, "I like green tea.");
    const byId = await engram.gql(CONTEXT, { input: { conversationId: turn.conversationId, message: "Anything new?" } });
    const byExternal = await engram.gql(CONTEXT, { input: { ...ids("zoe-1"), message: "Anything new?" } }, engram.tenant.reader);
    expect(byExternal.errors).toBeUndefined();
    expect(byExternal.data).toEqual(byId.data);
    expect(byExternal.data.context.conversationId).toBe(turn.conversationId);
  });

  it("a conversation with no turn yet gets the user's facts; an unknown user an empty context", async () => {
    const { data: user } = await engram.gql(`query { endUserByExternalId(externalId: "zoe") { id } }`);
    const added = await engram.gql(`mutation($input: AddFactInput!) { addFact(input: $input) { id } }`, {
      input: { endUserId: user.endUserByExternalId.id, text: "Zoe is allergic to cats." },
    });
    expect(added.errors).toBeUndefined();
    const fresh = await engram.gql(CONTEXT, { input: { ...ids("zoe-new"), message: "Hi" } });
    expect(fresh.errors).toBeUndefined();
    expect(fresh.data.context).toMatchObject({ conversationId: null, blocks: [{ kind: "FACTS", text: '- "Zoe is allergic to cats."' }] });

    const nobody = await engram.gql(CONTEXT, { input: { ...ids("ghost-1", "ghost"), message: "Hi" } });
    expect(nobody.data.context).toEqual({ conversationId: null, blocks: [] });
    expect(await engram.services.db.conversation.count({ where: { externalId: { in: ["zoe-new", "ghost-1"] } } })).toBe(0);
  });

  it("takes exactly one of the two forms, and refuses a conversation of another user", async () => {
    const turn = await recorded({ user: "zoe", conversation: "zoe-2" }, "Hello.");
    const both = await engram.gql(CONTEXT, { input: { conversationId: turn.conversationId, ...ids("zoe-2"), message: "Hi" } });
    expect(both.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    const neither = await engram.gql(CONTEXT, { input: { message: "Hi" } });
    expect(neither.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    const partial = await engram.gql(CONTEXT, { input: { agentExternalId: "shop", conversationExternalId: "zoe-2", message: "Hi" } });
    expect(partial.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    const someoneElse = await engram.gql(CONTEXT, { input: { ...ids("zoe-2", "mallory"), message: "Hi" } });
    expect(someoneElse.errors?.[0].extensions?.code).toBe("CONFLICT");
  });
});

describe("recallIndexStatus and indexedAt", () => {
  it("counts turns and snippets not searchable yet, down to zero", async () => {
    const status = async (endUserId: string) => {
      const { data, errors } = await engram.gql(RecallIndexStatusDocument, { endUserId }, engram.tenant.reader);
      expect(errors).toBeUndefined();
      return data.recallIndexStatus;
    };
    const turn = await recorded({ user: "ivy", conversation: "ivy-1" }, "I collect vintage postcards from Lisbon.");
    const inOutbox = await status(turn.endUserId);
    expect(inOutbox.pending).toBe(1);
    expect(inOutbox.oldestPendingAt).not.toBeNull();

    // Out of the outbox with its snippet, which the index job has not embedded yet: still not searchable.
    await runTurnWork(db(), engram.services.deps, { tenantId: engram.tenant.tenantId, turnId: turn.id });
    expect((await status(turn.endUserId)).pending).toBe(1);

    await runIndexSnippets(db(), engram.services.deps, {
      tenantId: engram.tenant.tenantId,
      conversationId: turn.conversationId,
      firstSeq: turn.firstSeq,
      lastSeq: turn.lastSeq,
    });
    expect(await status(turn.endUserId)).toEqual({ pending: 0, oldestPendingAt: null });

    const { data } = await engram.gql(RECALL, { input: { endUserId: turn.endUserId, text: "vintage postcards" } });
    expect(data.recall.candidates.length).toBeGreaterThan(0);
    for (const c of data.recall.candidates) expect(Date.parse(c.indexedAt)).toBeGreaterThan(0);

    // A snippet that lost its vector counts again.
    await engram.services.db.recallSnippet.updateMany({ where: { conversationId: turn.conversationId }, data: { indexedAt: null } });
    expect((await status(turn.endUserId)).pending).toBe(1);
    const missing = await engram.gql(RecallIndexStatusDocument, { endUserId: "no-such-user" });
    expect(missing.errors?.[0].extensions?.code).toBe("NOT_FOUND");
  });
});
