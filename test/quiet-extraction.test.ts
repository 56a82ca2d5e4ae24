import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { factsScript } from "./helpers/scripted-memory-model.ts";
import { until } from "./helpers/until.ts";

// Seed 003's quiet-period timer: a short conversation whose gate said "nothing to remember" and
// that never fills a batch is still read by the extractor once it has been quiet a while.
let model: ModelServer;
let engram: TestEngram;
let extractorCalls = 0;
beforeAll(async () => {
  const script = factsScript({
    triage: () => ({ remember: false }),
    extract: (messages) => {
      extractorCalls++;
      return messages.filter((m) => m.role === "user" && /vegetarian/.test(m.content)).map((m) => ({ text: "The user is vegetarian.", core: true, seq: m.seq }));
    },
  });
  ({ model, engram } = await startEngramWithModel({ worker: true, env: { ENGRAM_EMBEDDINGS: "offline" }, respond: script }));
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

describe("quiet-period extraction", () => {
  it("reads a quiet conversation's pending messages below the batch size, once", async () => {
    await engram.gql(`mutation { upsertAgent(input: {externalId: "quiet", settings: {quietExtractionSeconds: 2, extractionBatchSize: 8}}) { settings { quietExtractionSeconds } } }`);
    let conversationId = "";
    let endUserId = "";
    for (const [n, text] of ["Hi there.", "I am vegetarian, by the way.", "Thanks!"].entries()) {
      const r = await engram.gql(
        `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { conversation { id endUser { id } } } }`,
        { input: { agentExternalId: "quiet", endUserExternalId: "quinn", conversationExternalId: "quiet-1", clientTurnId: `quiet-${n}`, userMessage: text, assistantMessage: "Sure." } },
      );
      conversationId = r.data.recordTurn.conversation.id;
      endUserId = r.data.recordTurn.conversation.endUser.id;
    }
    const facts = await until("the quiet extraction", async () => {
      const rows = await engram.services.db.fact.findMany({ where: { endUserId } });
      return rows.length ? rows : null;
    }, 90_000);
    expect(facts.map((f) => f.text)).toEqual(["The user is vegetarian."]);
    await until("the extractor's progress", async () => {
      const conversation = await engram.services.db.conversation.findUniqueOrThrow({ where: { id: conversationId } });
      return conversation.extractedThroughSeq === conversation.lastSeq;
    });
    // The timer fired once for the burst; nothing is read twice.
    await new Promise((resolve) => setTimeout(resolve, 4_000));
    expect(extractorCalls).toBe(1);
    expect(await engram.services.db.fact.count({ where: { endUserId } })).toBe(1);
  }, 180_000);
});
