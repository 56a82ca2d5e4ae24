import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { UNREADABLE_TRIES } from "../src/work/dead-letter.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { factsScript, memoryScript } from "./helpers/scripted-memory-model.ts";
import { until } from "./helpers/until.ts";

// A model that answers, but never anything readable: the summary job is retried with backoff
// and then dead-lettered, where jobRuns (and the inspector) show it; it is never marked done.
// Its first answers are an outage, which delays the work and counts no try.
const OUTAGES = 2;
let model: ModelServer;
let engram: TestEngram;
let summaryCalls = 0;
let refusedCalls = 0;
beforeAll(async () => {
  // Everything else answers well (the triage, extraction and judges), so only the summary gives up.
  const memory = factsScript({}, memoryScript());
  ({ model, engram } = await startEngramWithModel({
    worker: true,
    env: { ENGRAM_EMBEDDINGS: "offline" },
    respond: (request) => {
      // A provider that refuses any extraction holding one message (413: past its context).
      if (request.chain === "extract" && JSON.stringify(request.messages).includes("TOO-LONG")) {
        refusedCalls++;
        return { status: 413 };
      }
      if (request.chain === "triage" && JSON.stringify(request.messages).includes("TOO-LONG")) {
        return JSON.stringify({ remember: true, forget: "NONE", forgetTargets: [], needsRecall: false });
      }
      if (request.chain !== "summary") return memory(request);
      summaryCalls++;
      if (summaryCalls <= OUTAGES) return { status: 503, message: "overloaded" };
      return "I would rather not summarise this.";
    },
  }));
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

describe("work whose model answers cannot be read", () => {
  it(`is retried ${UNREADABLE_TRIES} times, outages apart, then dead-lettered as a FAILED job run naming the conversation`, async () => {
    let conversationId = "";
    for (let n = 1; n <= 5; n++) {
      const turn = await engram.gql(
        `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { conversation { id } } }`,
        { input: { agentExternalId: "dl", endUserExternalId: "dl-user", conversationExternalId: "dl-1", clientTurnId: `dl-${n}`, userMessage: `Question ${n}?`, assistantMessage: `Answer ${n}.` } },
      );
      conversationId = turn.data.recordTurn.conversation.id;
    }
    const runs = await until(
      "the dead letter",
      async () => {
        const { data } = await engram.gql(`{ jobRuns(first: 20) { name status result } }`);
        const dead = data.jobRuns.filter((r: any) => r.result?.deadLetter && r.name === "memory.summarize");
        return dead.length ? dead : null;
      },
      180_000,
    );
    expect(runs[0]).toMatchObject({
      name: "memory.summarize",
      status: "FAILED",
      result: { deadLetter: true, tries: UNREADABLE_TRIES, conversationId, reason: expect.stringMatching(/could not be read/) },
    });
    // Summary requests of turns still arriving may add a run each; none comes sooner than this.
    expect(summaryCalls).toBeGreaterThanOrEqual(OUTAGES + UNREADABLE_TRIES);
    expect((await engram.services.db.conversation.findUniqueOrThrow({ where: { id: conversationId } })).summary).toBeNull();
  }, 240_000);

  it(`counts an extraction the provider refuses as it is (413) the same way: ${UNREADABLE_TRIES} tries, then a dead letter, not a call a minute for ever`, async () => {
    const turn = await engram.gql(
      `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { conversation { id } } }`,
      { input: { agentExternalId: "dl", endUserExternalId: "dl-413", conversationExternalId: "dl-413", clientTurnId: "dl-413-1", userMessage: "I keep bees. TOO-LONG", assistantMessage: "Noted." } },
    );
    const conversationId = turn.data.recordTurn.conversation.id;
    const runs = await until(
      "the extraction's dead letter",
      async () => {
        const { data } = await engram.gql(`{ jobRuns(first: 50) { name status result } }`);
        const dead = data.jobRuns.filter((r: any) => r.result?.deadLetter && r.result.conversationId === conversationId);
        return dead.length ? dead : null;
      },
      180_000,
    );
    expect(runs[0]).toMatchObject({ status: "FAILED", result: { deadLetter: true, tries: UNREADABLE_TRIES, reason: "fact extraction: model provider answered 413: the request is past the model's context" } });
    expect(refusedCalls).toBeGreaterThanOrEqual(UNREADABLE_TRIES);
    // Nothing was read past it: the batch waits for a model that takes it.
    expect((await engram.services.db.conversation.findUniqueOrThrow({ where: { id: conversationId } })).extractedThroughSeq).toBe(0);
  }, 240_000);
});
