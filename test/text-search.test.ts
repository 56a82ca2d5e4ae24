import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { Prisma } from "../src/generated/prisma/client.ts";
import { createEntry, relevantEntries, searchEntryIds } from "../src/memory/log/entries.ts";
import { searchSnippets } from "../src/memory/recall/recall.ts";
import { matchesAnyPhrase } from "../src/memory/text-search.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";

const URL_TEXT = "https://booking.example.com/hotel:du-nord?id=1";
const RECORD = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { conversation { id } } }`;
const CONTEXT = `query($input: ContextInput!) { context(input: $input) { blocks { kind text } } }`;

/** A seeded generator, so a failure can be replayed. */
function random(seed: number) {
  return () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x80000000);
}

const PIECES = [
  ...`:&|!()<>*'"\\?/=#%@-_.,;[]{}~^$+\``.split(""),
  "https://a.example/x:y?z=1", "foo:*", "'''", "\\'", "a & b", "!!", "<->", "<2>", ":A", ":*B",
  "é", "日本語", "🙂", "ß", "İ", "\u200b", "\u00a0", "\t", "\n", "\r", "\u0001", "\u007f", "\u001b[0m",
  "word", "hotel", "du-nord", "the", "and", "running", "123", "3.14", "user@mail.example",
];

function fuzzText(next: () => number): string {
  const parts: string[] = [];
  const count = 1 + Math.floor(next() * 8);
  for (let i = 0; i < count; i++) {
    const piece = PIECES[Math.floor(next() * PIECES.length)];
    parts.push(piece, next() < 0.5 ? " " : "");
  }
  return parts.join("");
}

describe("full-text queries from user text", () => {
  let engram: TestEngram;
  beforeAll(async () => {
    engram = await startTestEngram({ env: { ENGRAM_EMBEDDINGS: "offline" } });
  });
  afterAll(() => engram?.stop());

  it("assembles context for a message with a URL, and finds the entry that holds it", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    await createEntry(db, engram.services.deps, { scope: "INSTITUTIONAL", scopeRef: "hotels", title: "Booking link", summary: `Book at ${URL_TEXT}` });
    const turn = await engram.gql(RECORD, {
      input: {
        agentExternalId: "concierge",
        endUserExternalId: "guest",
        conversationExternalId: "urls",
        clientTurnId: "urls-1",
        userMessage: `Is ${URL_TEXT} still the right page?`,
        assistantMessage: "Yes.",
      },
    });
    expect(turn.errors).toBeUndefined();
    const { data, errors } = await engram.gql(CONTEXT, {
      input: { conversationId: turn.data.recordTurn.conversation.id, message: `Book ${URL_TEXT} for me` },
    });
    expect(errors).toBeUndefined();
    expect(JSON.stringify(data.context.blocks.find((b: any) => b.kind === "ENTRIES"))).toContain("hotel:du-nord");
  });

  it("never fails on a few hundred random texts with punctuation, unicode and control characters", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const next = random(12);
    const texts = Array.from({ length: 300 }, () => fuzzText(next));
    texts.push(URL_TEXT, "", " ", "'", "\\", "&|!", "a:b c:d", "it's o'clock", "back\\slash 'quote'");
    for (const text of texts) {
      await expect(relevantEntries(db, { text, agentExternalId: "concierge", endUserExternalId: "guest", limit: 3 }), JSON.stringify(text)).resolves.toBeDefined();
      await expect(searchEntryIds(db, { search: text || "x" }, { limit: 3, offset: 0 }), JSON.stringify(text)).resolves.toBeDefined();
    }
    // Recall's keyword side, over a user with a snippet holding the URL: no text fails it, and the URL finds it.
    const { id: endUserId } = await db.endUser.findFirstOrThrow({ where: { externalId: "guest" } });
    const conversation = await db.conversation.findFirstOrThrow({ where: { externalId: "urls" } });
    const snippet = await db.recallSnippet.create({
      data: { tenantId: engram.tenant.tenantId, endUserId, conversationId: conversation.id, kind: "TURN", text: `user: see ${URL_TEXT} (it's O'Brien's)`, occurredAt: new Date(), messageIds: [] },
    });
    for (const text of texts) {
      await expect(searchSnippets(db, engram.services.deps, { endUserId, text, k: 3, mode: "KEYWORD" }), JSON.stringify(text)).resolves.toBeDefined();
    }
    for (const text of [URL_TEXT, "O'Brien", "booking.example.com"]) {
      const { candidates } = await searchSnippets(db, engram.services.deps, { endUserId, text, k: 3, mode: "KEYWORD" });
      expect(candidates.map((c) => c.snippetId), text).toEqual([snippet.id]);
    }
    // Forgetting's phrase match: every text is tried at once, and each one with words matches itself.
    for (let i = 0; i < texts.length; i += 50) {
      const batch = texts.slice(i, i + 50);
      const rows = await engram.services.db.$queryRaw<{ text: string; hit: boolean | null; words: number }[]>`
        SELECT t AS text,
               ${matchesAnyPhrase(Prisma.sql`to_tsvector('english', t)`, batch)} AS hit,
               length(to_tsvector('english', t)) AS words
        FROM unnest(${batch}::text[]) AS t`;
      for (const row of rows) expect(row.hit ?? false, JSON.stringify(row.text)).toBe(row.words > 0);
    }
  });

  it("matches a phrase by all of its words, stemmed", async () => {
    const [row] = await engram.services.db.$queryRaw<{ yes: boolean; no: boolean }[]>`
      SELECT ${matchesAnyPhrase(Prisma.sql`to_tsvector('english', 'I moved to 12 Rue de Rivoli; addresses change')`, ["my address", "rivoli"])} AS yes,
             coalesce(${matchesAnyPhrase(Prisma.sql`to_tsvector('english', 'nothing here')`, ["my address", ":&|"])}, false) AS no`;
    expect(row).toEqual({ yes: true, no: false });
  });
});
