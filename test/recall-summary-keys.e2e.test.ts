import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { forgetSnippets } from "../src/memory/forget.ts";
import { closestTurn, summarySentences, syncSummaryKeys } from "../src/memory/recall/snippets.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import { bagOfWords } from "./helpers/fake-embeddings.ts";
import type { ChatRequest, ModelServer } from "./helpers/model-server.ts";
import { allIndexed, INDEXING_TIMEOUT_MS, RECALL, say } from "./helpers/recall.ts";
import { factsScript, memoryScript } from "./helpers/scripted-memory-model.ts";
import { until } from "./helpers/until.ts";

// A scripted summarizer whose summary names what two of the folded turns were about, in words
// ("Mira", "cabin") that only the summary has.
const SUMMARY = "The user's sister Mira moved to Lisbon. The user bought a teal kettle for the cabin.";
const memory = memoryScript();
const summarizer = (request: ChatRequest) => (request.chain === "summary" ? JSON.stringify({ summary: SUMMARY }) : memory(request));

let model: ModelServer;
let engram: TestEngram;
let endUserId: string;
let conversationId: string;
beforeAll(async () => {
  ({ model, engram } = await startEngramWithModel({
    worker: true,
    embed: (input) => input.map((text) => bagOfWords(text)),
    env: { ENGRAM_EMBEDDING_MODEL: "scripted-embed" },
    respond: factsScript({ triage: () => ({ remember: false }), extract: () => [] }, summarizer),
  }));
  const who = { user: "nora", conversation: "nora-1" };
  const first = await say(engram, who, "My sister moved to Lisbon last spring.", "Lovely city, lots of hills.");
  ({ endUserId, conversationId } = first);
  await say(engram, who, "I ordered the teal kettle yesterday.", "Good choice, it boils fast.");
  for (const n of [3, 4, 5]) await say(engram, who, `Question ${n} about the delivery window.`, `Delivery window ${n} is in the morning.`);
  // Ten messages, a tail of 6: the accepted summary covers the first two turns.
  await until("the summary's keys to be indexed", async () => {
    const keys = await engram.services.db.recallSnippet.findMany({ where: { conversationId, kind: "SUMMARY" } });
    const conversation = await engram.services.db.conversation.findUniqueOrThrow({ where: { id: conversationId } });
    // (A rewrite that covered only the first turn would point both sentences at it.)
    const turns = new Set(keys.map((k) => k.keyOfId));
    return conversation.summaryThroughSeq === 4 && keys.length === 2 && turns.size === 2 && keys.every((k) => k.indexedAt);
  }, INDEXING_TIMEOUT_MS);
  await allIndexed(engram, engram.tenant.tenantId, INDEXING_TIMEOUT_MS);
}, 2 * INDEXING_TIMEOUT_MS);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

const turnSaying = (words: string) =>
  engram.services.db.recallSnippet.findFirstOrThrow({ where: { conversationId, kind: "TURN", text: { contains: words } } });

describe("accepted summaries as recall keys", () => {
  it("each sentence of the summary points to the covered turn it is about", async () => {
    const [lisbon, kettle] = [await turnSaying("Lisbon"), await turnSaying("kettle")];
    const keys = await engram.services.db.recallSnippet.findMany({ where: { conversationId, kind: "SUMMARY" }, orderBy: { text: "asc" } });
    expect(keys.map((k) => [k.text, k.keyOfId])).toEqual([
      ["The user bought a teal kettle for the cabin.", kettle.id],
      ["The user's sister Mira moved to Lisbon.", lisbon.id],
    ]);
  });

  it("a hit on a summary sentence is credited to its turn, once, and the sentence is not returned itself", async () => {
    const lisbon = await turnSaying("Lisbon");
    // "Mira" is only in the summary, never in the turn.
    for (const mode of ["KEYWORD", "HYBRID"]) {
      const { data } = await engram.gql(RECALL, { input: { endUserId, text: "Where does Mira live now?", mode } }, engram.tenant.reader);
      const candidates = data.recall.candidates;
      expect(candidates[0]).toMatchObject({ snippetId: lisbon.id, kind: "TURN", keywordRank: 1 });
      expect(candidates.filter((c: { snippetId: string }) => c.snippetId === lisbon.id)).toHaveLength(1);
      expect(candidates.some((c: { kind: string }) => c.kind === "SUMMARY")).toBe(false);
    }
  });

  it("an unchanged summary keeps its keys; a new one replaces them, vectors too; a forgotten turn takes its key", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const vectors = () => engram.services.vectors.count(engram.tenant.tenantId, { conversationId });
    const before = await engram.services.db.recallSnippet.findMany({ where: { conversationId, kind: "SUMMARY" }, select: { id: true } });
    expect(await syncSummaryKeys(db, engram.services.deps, conversationId)).toEqual([]);
    expect(await vectors()).toBe(5 + 2);

    await engram.services.db.conversation.update({ where: { id: conversationId }, data: { summary: "Mira, the user's sister, lives in Lisbon now." } });
    const ids = await syncSummaryKeys(db, engram.services.deps, conversationId);
    expect(ids).toHaveLength(1);
    const keys = await engram.services.db.recallSnippet.findMany({ where: { conversationId, kind: "SUMMARY" } });
    expect(keys.map((k) => [k.id, k.keyOfId])).toEqual([[ids[0], (await turnSaying("Lisbon")).id]]);
    expect(before.some((b) => ids.includes(b.id))).toBe(false);
    expect(await vectors()).toBe(5);

    await forgetSnippets(db, engram.services.deps, [(await turnSaying("Lisbon")).id]);
    expect(await engram.services.db.recallSnippet.count({ where: { conversationId, kind: "SUMMARY" } })).toBe(0);
  });

  it("splits sentences, and points a sentence nowhere when no covered turn shares a distinctive word with it", () => {
    expect(summarySentences("Mira lives in Lisbon. She likes trams!  Why? ")).toEqual(["Mira lives in Lisbon.", "She likes trams!", "Why?"]);
    const turns = [{ text: "user: hello there\nassistant: hello" }, { text: "user: the kettle is teal\nassistant: hello" }];
    expect(closestTurn("A teal kettle.", turns)).toBe(turns[1]);
    // "hello" is in every turn: it says nothing about which one.
    expect(closestTurn("They said hello.", turns)).toBeNull();
    expect(closestTurn("Nothing in common.", turns)).toBeNull();
  });
});
