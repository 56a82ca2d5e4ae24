import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { forgetSnippets } from "../src/memory/forget.ts";
import { applyCandidate } from "../src/memory/facts/facts.ts";
import { indexSnippets, syncFactKeys } from "../src/memory/recall/snippets.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import { bagOfWords } from "./helpers/fake-embeddings.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { RECALL } from "./helpers/recall.ts";
import { factsScript } from "./helpers/scripted-memory-model.ts";
import { until } from "./helpers/until.ts";

// A scripted extractor that keeps a fact about the user and one about a person the user names.
const RECORD = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { conversation { id endUser { id } } } }`;
const CONTEXT = `query($input: ContextInput!) { context(input: $input) { blocks { kind text } } }`;

let model: ModelServer;
let engram: TestEngram;
let endUserId: string;
beforeAll(async () => {
  ({ model, engram } = await startEngramWithModel({
    worker: true,
    embed: (input) => input.map((text) => bagOfWords(text)),
    env: { ENGRAM_EMBEDDING_MODEL: "scripted-embed" },
    respond: factsScript({
      triage: () => ({ remember: true }),
      extract: (messages) =>
        messages.flatMap((m) =>
          m.role !== "user"
            ? []
            : /daughter Ana/.test(m.content)
              ? [
                  { text: "Ana, the user's daughter, is allergic to nuts.", seq: m.seq, core: true, subject: "Ana (daughter)" },
                  { text: "The user is vegetarian.", seq: m.seq, core: true, subject: null },
                ]
              : [],
        ),
    }),
  }));
  const first = await engram.gql(
    RECORD,
    {
      input: {
        agentExternalId: "chef",
        endUserExternalId: "lena",
        conversationExternalId: "lena-1",
        clientTurnId: "l1",
        userMessage: "I'm vegetarian, and my daughter Ana can't have peanuts or any other nuts.",
        assistantMessage: "Noted, no meat and nothing with nuts.",
      },
    },
    engram.tenant.writer,
  );
  endUserId = first.data.recordTurn.conversation.endUser.id;
  await until("the facts and their recall keys to be indexed", async () => {
    const keys = await engram.services.db.recallSnippet.findMany({ where: { endUserId, kind: "FACT" } });
    return keys.length === 2 && keys.every((k) => k.indexedAt);
  });
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

describe("facts about the people the user names", () => {
  it("keeps the subject on the end user's profile, and the FACTS block groups the facts by subject", async () => {
    const facts = await engram.gql(`query($id: ID!) { facts(endUserId: $id) { text subject } }`, { id: endUserId }, engram.tenant.reader);
    expect(facts.data.facts).toEqual(
      expect.arrayContaining([
        { text: "Ana, the user's daughter, is allergic to nuts.", subject: "Ana (daughter)" },
        { text: "The user is vegetarian.", subject: null },
      ]),
    );
    const second = await engram.gql(
      RECORD,
      { input: { agentExternalId: "chef", endUserExternalId: "lena", conversationExternalId: "lena-2", clientTurnId: "l2", userMessage: "Dinner ideas?" } },
      engram.tenant.writer,
    );
    const { data } = await engram.gql(
      CONTEXT,
      { input: { conversationId: second.data.recordTurn.conversation.id, message: "Dinner ideas for tonight?" } },
      engram.tenant.reader,
    );
    const block = data.context.blocks.find((b: { kind: string }) => b.kind === "FACTS");
    expect(block.text).toBe('- "The user is vegetarian."\n\nAbout "Ana (daughter)":\n- "Ana, the user\'s daughter, is allergic to nuts."');
  });

  it("a person can set and clear the subject", async () => {
    const added = await engram.gql(
      `mutation($input: AddFactInput!) { addFact(input: $input) { id subject } }`,
      { input: { endUserId, text: "Tom, the user's son, plays the cello.", subject: " Tom (son) " } },
      engram.tenant.writer,
    );
    expect(added.data.addFact.subject).toBe("Tom (son)");
    const cleared = await engram.gql(
      `mutation($id: ID!, $input: CorrectFactInput!) { correctFact(id: $id, input: $input) { subject text } }`,
      { id: added.data.addFact.id, input: { subject: null } },
      engram.tenant.writer,
    );
    expect(cleared.data.correctFact).toEqual({ subject: null, text: "Tom, the user's son, plays the cello." });
  });
});

describe("a key rewritten while it is being indexed", () => {
  it("ends with the vector of its new text, not of the text the index job read", async () => {
    const tenantId = engram.tenant.tenantId;
    const db = forTenant(engram.services.db, tenantId);
    const { deps } = engram.services;
    const fact = await db.fact.findFirstOrThrow({ where: { endUserId, text: "The user is vegetarian." } });
    // An extraction updates the fact: its key is rewritten, to be embedded again.
    await db.fact.update({ where: { id: fact.id }, data: { text: "The user is vegan now." } });
    await syncFactKeys(db, deps, endUserId);
    const key = await db.recallSnippet.findFirstOrThrow({ where: { factId: fact.id } });
    expect(key).toMatchObject({ text: "The user is vegan now.", indexedAt: null });
    // An index job embeds that text; while it does, the next extraction updates the fact again.
    const latest = "The user eats salmon on Fridays.";
    const racing = {
      ...deps,
      embeddings: {
        ...deps.embeddings,
        forTenant: async (id: string) => {
          const route = await deps.embeddings.forTenant(id);
          const embedDocuments = async (texts: string[]) => {
            const vectors = await route.embeddings.embedDocuments(texts);
            await db.fact.update({ where: { id: fact.id }, data: { text: latest } });
            await syncFactKeys(db, deps, endUserId);
            return vectors;
          };
          return { ...route, embeddings: { embedDocuments } as unknown as typeof route.embeddings };
        },
      },
    };
    await indexSnippets(db, racing, [key.id]);
    // The index job the second rewrite queued.
    await indexSnippets(db, deps, [key.id]);
    const { model } = await deps.embeddings.forTenant(tenantId);
    const [stored] = await deps.vectors.vectorsByIds({ tenantId, model }, [key.id]);
    const cosine = (a: number[], b: number[]) => a.reduce((sum, x, i) => sum + x * b[i], 0) / (Math.hypot(...a) * Math.hypot(...b));
    expect(cosine(stored.vector, bagOfWords(latest))).toBeGreaterThan(0.99);
    expect(await db.recallSnippet.findUniqueOrThrow({ where: { id: key.id } })).toMatchObject({ text: latest, indexedAt: expect.any(Date) });
  });
});

describe("facts as recall keys", () => {
  it("a fact's sentence finds the turn it came from, credited once, and goes with the turn", async () => {
    const turn = await engram.services.db.recallSnippet.findFirstOrThrow({ where: { endUserId, kind: "TURN" } });
    const keys = await engram.services.db.recallSnippet.findMany({ where: { endUserId, kind: "FACT" } });
    expect(keys.map((k) => k.keyOfId)).toEqual([turn.id, turn.id]);
    expect(keys.map((k) => k.conversationId)).toEqual([turn.conversationId, turn.conversationId]);

    // "allergic" is only in the fact's sentence, never in the turn itself.
    for (const mode of ["KEYWORD", "HYBRID"]) {
      const { data } = await engram.gql(RECALL, { input: { endUserId, text: "Is Ana allergic to anything?", mode } }, engram.tenant.reader);
      const candidates = data.recall.candidates;
      expect(candidates[0]).toMatchObject({ snippetId: turn.id, kind: "TURN", keywordRank: 1 });
      expect(candidates.filter((c: { snippetId: string }) => c.snippetId === turn.id)).toHaveLength(1);
      expect(candidates.some((c: { kind: string }) => c.kind === "FACT")).toBe(false);
    }

    // Forgetting the turn takes its keys and their vectors too.
    const where = { conversationId: turn.conversationId };
    expect(await engram.services.vectors.count(engram.tenant.tenantId, where)).toBe(3);
    await forgetSnippets(forTenant(engram.services.db, engram.tenant.tenantId), engram.services.deps, [turn.id]);
    expect(await engram.services.db.recallSnippet.count({ where })).toBe(0);
    expect(await engram.services.vectors.count(engram.tenant.tenantId, where)).toBe(0);
  });
});

describe("a fact a person corrects", () => {
  it("takes its recall key with it: the turn is no longer found through the wording the person corrected", async () => {
    const tenantId = engram.tenant.tenantId;
    const db = forTenant(engram.services.db, tenantId);
    const said = await engram.gql(
      RECORD,
      {
        input: {
          agentExternalId: "chef",
          endUserExternalId: "mia",
          conversationExternalId: "mia-1",
          clientTurnId: "m1",
          userMessage: "My daughter Ana can't have peanuts or any other nuts.",
          assistantMessage: "Noted, nothing with nuts.",
        },
      },
      engram.tenant.writer,
    );
    const mia = said.data.recordTurn.conversation.endUser.id;
    await until("Mia's facts and their recall keys to be indexed", async () => {
      const keys = await db.recallSnippet.findMany({ where: { endUserId: mia, kind: "FACT" } });
      return keys.length === 2 && keys.every((k) => k.indexedAt);
    });
    const fact = await db.fact.findFirstOrThrow({ where: { endUserId: mia, text: "Ana, the user's daughter, is allergic to nuts." } });
    const keyIds = (await db.recallSnippet.findMany({ where: { factId: fact.id } })).map((k) => k.id);
    expect(keyIds).toHaveLength(1);
    // "allergic" is in the extracted sentence only: before the correction it finds the turn.
    const search = { endUserId: mia, text: "Who is allergic?", mode: "KEYWORD" };
    const before = await engram.gql(RECALL, { input: search }, engram.tenant.reader);
    expect(before.data.recall.candidates).toHaveLength(1);

    const corrected = await engram.gql(
      `mutation($id: ID!, $input: CorrectFactInput!) { correctFact(id: $id, input: $input) { text } }`,
      { id: fact.id, input: { text: "Ana, the user's daughter, avoids nuts by choice." } },
      engram.tenant.writer,
    );
    expect(corrected.data.correctFact.text).toBe("Ana, the user's daughter, avoids nuts by choice.");

    // Neither the key's row (the keyword side) nor its vector (the vector side) is left.
    expect(await db.recallSnippet.count({ where: { factId: fact.id } })).toBe(0);
    expect(await engram.services.vectors.count(tenantId, { ids: keyIds })).toBe(0);
    const after = await engram.gql(RECALL, { input: search }, engram.tenant.reader);
    expect(after.data.recall.candidates).toEqual([]);
    // The other fact's key, and the turn, stay.
    expect(await db.recallSnippet.count({ where: { endUserId: mia, kind: { in: ["FACT", "TURN"] } } })).toBe(2);
  });
});

describe("a fact the extractor updates", () => {
  it("drops its old sentence's key with the update: not found through the replaced wording, even before its key is synced", async () => {
    const tenantId = engram.tenant.tenantId;
    const db = forTenant(engram.services.db, tenantId);
    const { deps } = engram.services;
    const mia = (await db.endUser.findFirstOrThrow({ where: { externalId: "mia" } })).id;
    const fact = await db.fact.findFirstOrThrow({ where: { endUserId: mia, text: "The user is vegetarian." } });
    const keyIds = (await db.recallSnippet.findMany({ where: { factId: fact.id, indexedAt: { not: null } } })).map((k) => k.id);
    expect(keyIds).toHaveLength(1);
    // "vegetarian" is in the fact's sentence only, not in the turn.
    const replaced = { endUserId: mia, text: "Is anyone vegetarian?", mode: "KEYWORD" };
    expect((await engram.gql(RECALL, { input: replaced }, engram.tenant.reader)).data.recall.candidates).toHaveLength(1);

    const message = await db.message.findFirstOrThrow({ where: { conversation: { endUserId: mia }, role: "USER" } });
    const outcome = await applyCandidate(db, deps, {
      endUserId: mia,
      candidate: { text: "The user eats fish on Fridays.", core: true, seq: message.seq },
      judgment: { durability: "durable", relation: "update", relatedFactId: fact.id, sensitivity: null },
      allowSensitive: false,
      sourceMessageId: message.id,
      conversationId: message.conversationId,
    });
    expect(outcome).toMatchObject({ change: "UPDATED", factId: fact.id });
    // Its key is synced and embedded after the extraction (indexFactKeys, then an index job),
    // which may fail, or wait on a spent budget: until then the replaced sentence finds nothing.
    expect(await engram.services.vectors.count(tenantId, { ids: keyIds })).toBe(0);
    expect((await engram.gql(RECALL, { input: replaced }, engram.tenant.reader)).data.recall.candidates).toEqual([]);

    // Synced and embedded, the new sentence finds the turn.
    await indexSnippets(db, deps, await syncFactKeys(db, deps, mia));
    const found = await engram.gql(RECALL, { input: { endUserId: mia, text: "fish on Fridays", mode: "KEYWORD" } }, engram.tenant.reader);
    expect(found.data.recall.candidates).toHaveLength(1);
    expect(await engram.services.vectors.count(tenantId, { ids: keyIds })).toBe(0);
  });
});
