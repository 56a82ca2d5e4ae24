import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant, type TenantDb } from "../src/db.ts";
import { importJsonl, type ImportLineResult } from "../src/memory/conversations/import-file.ts";
import { afterTurnRecorded } from "../src/work/after-turn.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";

// `engram import` reads a JSONL file into importConversation, one conversation a line, as the
// API's importConversation takes one: what the API refuses, a line is refused for, and says why.

let engram: TestEngram;
let db: TenantDb;
let dir: string;

beforeAll(async () => {
  engram = await startTestEngram();
  db = forTenant(engram.services.db, engram.tenant.tenantId);
  dir = mkdtempSync(path.join(tmpdir(), "engram-import-"));
}, 120_000);
afterAll(async () => {
  rmSync(dir, { recursive: true, force: true });
  await engram?.stop();
});

/** Imports `lines` (each an object, or a raw line) as `engram import` does; its results. */
async function importLines(name: string, lines: unknown[]): Promise<ImportLineResult[]> {
  const file = path.join(dir, `${name}.jsonl`);
  writeFileSync(file, lines.map((line) => (typeof line === "string" ? line : JSON.stringify(line))).join("\n"));
  const results: ImportLineResult[] = [];
  for await (const result of importJsonl(db, file, (imported) => afterTurnRecorded(db, engram.services.deps, imported))) results.push(result);
  return results;
}

const line = (conversation: string, messages: unknown[]) => ({ agentExternalId: "mover", endUserExternalId: "dana", conversationExternalId: conversation, messages });

const storedDates = async (conversation: string) =>
  (await db.message.findMany({ where: { conversation: { externalId: conversation } }, orderBy: { seq: "asc" }, select: { occurredAt: true } })).map((m) =>
    m.occurredAt.toISOString(),
  );

describe("engram import's dates", () => {
  // The file's dates went through `new Date(String(x))`: 01/12/2025 was 12 January in the CLI's
  // time zone, 2026-02-30 was 2 March, 0 was now, and a naive time was the CLI machine's local time.
  it("takes ISO-8601 only, UTC without an offset, and refuses a day the month does not have, naming the line and the message", async () => {
    const results = await importLines("dates", [
      line("dates-ok", [
        { role: "user", content: "Zoned.", occurredAt: "2025-12-01T10:00:00+02:00" },
        { role: "assistant", content: "Naive.", occurredAt: "2025-12-01T10:00:05" },
        { role: "user", content: "Spaced.", occurredAt: "2025-12-01 10:00:09" },
        { role: "assistant", content: "A leap day.", occurredAt: "2024-02-29" },
      ]),
      line("dates-us", [{ role: "user", content: "Which day?", occurredAt: "01/12/2025" }]),
      line("dates-feb30", [{ role: "user", content: "No such day.", occurredAt: "2026-02-30T00:00:00Z" }]),
      line("dates-zero", [{ role: "user", content: "Epoch or now?", occurredAt: 0 }]),
      line("dates-far", [{ role: "user", content: "Too far.", occurredAt: "+275760-09-13T00:00:00Z" }]),
    ]);
    expect(results[0].error).toBeUndefined();
    expect(await storedDates("dates-ok")).toEqual(["2025-12-01T08:00:00.000Z", "2025-12-01T10:00:05.000Z", "2025-12-01T10:00:09.000Z", "2024-02-29T00:00:00.000Z"]);
    expect(results.slice(1).map((r) => [r.line, r.error])).toEqual([
      [2, expect.stringMatching(/^messages\[0\]\.occurredAt must be an ISO-8601 date-time .*, not "01\/12\/2025"$/)],
      [3, expect.stringMatching(/^messages\[0\]\.occurredAt must be .*, not "2026-02-30T00:00:00Z"$/)],
      [4, expect.stringMatching(/^messages\[0\]\.occurredAt must be .*, not 0$/)],
      [5, expect.stringMatching(/^messages\[0\]\.occurredAt must be .* between the years 0001 and 9999/)],
    ]);
    expect(await db.conversation.count({ where: { externalId: { startsWith: "dates-" } } })).toBe(1);
  });

  it("is the rule the API's DateTime takes", async () => {
    const IMPORT = `mutation($input: ImportConversationInput!) { importConversation(input: $input) { id messages(first: 1) { edges { node { occurredAt } } } } }`;
    const naive = await engram.gql(IMPORT, { input: line("api-naive", [{ role: "USER", content: "Naive.", occurredAt: "2025-12-01T10:00:05" }]) });
    expect(naive.errors).toBeUndefined();
    expect(naive.data.importConversation.messages.edges[0].node.occurredAt).toBe("2025-12-01T10:00:05.000Z");
    const feb30 = await engram.gql(IMPORT, { input: line("api-feb30", [{ role: "USER", content: "No such day.", occurredAt: "2026-02-30T00:00:00Z" }]) });
    expect(feb30.errors?.[0]).toMatchObject({ extensions: { code: "BAD_USER_INPUT" } });
  });
});

describe("a moment in the future", () => {
  // Retention removes snippets older than the window by their occurredAt: one dated years ahead
  // (a typo: 2062 for 2026) was accepted and would have outlived any window until then.
  it("is refused for an import's message and a recorded turn, beyond a day of clock skew", async () => {
    const ahead = (ms: number) => new Date(Date.now() + ms).toISOString();
    const results = await importLines("future", [
      line("future-typo", [{ role: "user", content: "Dated 2062.", occurredAt: "2062-01-05T10:00:00Z" }]),
      line("future-skew", [{ role: "user", content: "A clock a minute fast.", occurredAt: ahead(60_000) }]),
    ]);
    expect(results.map((r) => r.error)).toEqual([
      "Invalid input: messages.0.occurredAt: is in the future: more than a day ahead of this server's clock",
      undefined,
    ]);
    const IMPORT = `mutation($input: ImportConversationInput!) { importConversation(input: $input) { id } }`;
    const imported = await engram.gql(IMPORT, { input: line("future-api", [{ role: "USER", content: "Ahead.", occurredAt: ahead(2 * 86_400_000) }]) });
    expect(imported.errors?.[0]).toMatchObject({ extensions: { code: "BAD_USER_INPUT" } });
    const RECORD = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { id } }`;
    const recorded = await engram.gql(RECORD, {
      input: { agentExternalId: "mover", endUserExternalId: "dana", conversationExternalId: "future-turn", clientTurnId: "future-1", userMessage: "Ahead.", occurredAt: "9999-01-01T00:00:00Z" },
    });
    expect(recorded.errors?.[0]).toMatchObject({ extensions: { code: "BAD_USER_INPUT" } });
    expect(await db.conversation.count({ where: { externalId: { in: ["future-typo", "future-api", "future-turn"] }, lastSeq: { gt: 0 } } })).toBe(0);
  });
});

describe("engram import's text", () => {
  // The API's edge refuses these; the file's went to the store, which answered with its own
  // errors ("invalid byte sequence for encoding UTF8: 0x00", Prisma's "JSON Error: unexpected end of hex escape").
  it("refuses a NUL or a lone surrogate in any text of a line, saying where, and writes nothing of it", async () => {
    const results = await importLines("text", [
      line("text-nul", [{ role: "user", content: "a\u0000b" }]),
      '{"agentExternalId": "mover", "endUserExternalId": "dana", "conversationExternalId": "text-surrogate", "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "half \\ud800"}]}',
      { ...line("text-id", [{ role: "user", content: "ok" }]), endUserExternalId: "dan\u0000a" },
      "null",
      line("text-null-message", [null]),
    ]);
    expect(results.map((r) => r.error)).toEqual([
      "the line.messages[0].content holds a NUL character (\\u0000)",
      "the line.messages[1].content holds a lone UTF-16 surrogate",
      "the line.endUserExternalId holds a NUL character (\\u0000)",
      "a line must be one JSON object",
      "messages[0] must be an object",
    ]);
    expect(await db.conversation.count({ where: { externalId: { startsWith: "text-" } } })).toBe(0);
  });
});

describe("messages forgotten but kept as a record", () => {
  // Compared with an import again, their text answered yes or no (the first conversation, or
  // CONFLICT) to a writer's guess, though no writer or reader may read them back.
  it("answer no guess at their text: any import again returns the first conversation", async () => {
    const settings = await engram.gql(`mutation { updateTenantSettings(input: {forgetDeletesMessages: false}) { forgetDeletesMessages } }`);
    expect(settings.errors).toBeUndefined();
    try {
      const [imported] = await importLines("kept", [{ ...line("kept-1", [{ role: "user", content: "My PIN is 4711." }]), endUserExternalId: "kim" }]);
      const RECORD = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { id } }`;
      const turn = (pin: string) => ({ agentExternalId: "mover", endUserExternalId: "kim", conversationExternalId: "kept-2", clientTurnId: "kept-2-1", userMessage: `My PIN is ${pin}.` });
      expect((await engram.gql(RECORD, { input: turn("4711") })).errors).toBeUndefined();
      const user = await db.endUser.findFirstOrThrow({ where: { externalId: "kim" } });
      const forgot = await engram.gql(`mutation($id: ID!) { forgetUser(endUserId: $id) { messages } }`, { id: user.id });
      expect(forgot.errors).toBeUndefined();
      expect(await db.message.count({ where: { conversationId: imported.conversationId, forgottenAt: { not: null } } })).toBe(1);

      const IMPORT = `mutation($input: ImportConversationInput!) { importConversation(input: $input) { id } }`;
      const guess = (pin: string) =>
        engram.gql(IMPORT, { input: { ...line("kept-1", [{ role: "USER", content: `My PIN is ${pin}.` }]), endUserExternalId: "kim" } }, engram.tenant.writer);
      const [right, wrong] = [await guess("4711"), await guess("1234")];
      expect(right.errors).toBeUndefined();
      expect(wrong.errors).toBeUndefined();
      expect(await db.message.count({ where: { conversationId: imported.conversationId } })).toBe(1);
      // A recorded turn's retry is compared the same way.
      expect((await engram.gql(RECORD, { input: turn("1234") }, engram.tenant.writer)).errors).toBeUndefined();
    } finally {
      await engram.gql(`mutation { updateTenantSettings(input: {forgetDeletesMessages: true}) { forgetDeletesMessages } }`);
    }
  });
});

describe("engram import's file", () => {
  // A file saved with a byte-order mark (Notepad's "UTF-8 with BOM", PowerShell 5's Out-File)
  // lost its first conversation: "Unexpected token '\uFEFF' ... is not valid JSON".
  it("reads a first line after a byte-order mark, and lines ending in CRLF", async () => {
    const results = await importLines("bom", [
      `\uFEFF${JSON.stringify(line("bom-1", [{ role: "user", content: "From Windows." }]))}\r`,
      `${JSON.stringify(line("bom-2", [{ role: "user", content: "Second line." }]))}\r`,
    ]);
    expect(results.map((r) => [r.line, r.messages, r.error])).toEqual([[1, 1, undefined], [2, 1, undefined]]);
  });
});

describe("importing again", () => {
  // A second run of the same file (after a crash, a killed command) failed every line it had
  // already imported with CONFLICT and exited 1; a retried importConversation whose answer was
  // lost was CONFLICT too, so the caller could not tell its import had landed.
  it("leaves a line imported before as it was, and still refuses other messages for its conversation", async () => {
    const file = [
      line("again-1", [{ role: "user", content: "First." }, { role: "assistant", content: "Noted." }]),
      line("again-2", [{ role: "user", content: "Second.", occurredAt: "2025-03-01T10:00:00Z" }]),
    ];
    const first = await importLines("again", file);
    expect(first.map((r) => [r.messages, r.already, r.error])).toEqual([[2, undefined, undefined], [1, undefined, undefined]]);
    // A turn recorded since does not make the import another one.
    await engram.gql(`mutation { recordTurn(input: {agentExternalId: "mover", endUserExternalId: "dana", conversationExternalId: "again-1", clientTurnId: "again-1-later", userMessage: "Later."}) { id } }`);

    const again = await importLines("again", [...file, line("again-3", [{ role: "user", content: "Third." }])]);
    expect(again.map((r) => [r.line, r.already, r.error])).toEqual([[1, true, undefined], [2, true, undefined], [3, undefined, undefined]]);
    expect(again[0].conversationId).toBe(first[0].conversationId);
    const seqs = await db.message.findMany({ where: { conversation: { externalId: "again-1" } }, select: { seq: true, content: true }, orderBy: { seq: "asc" } });
    expect(seqs.map((m) => m.content)).toEqual(["First.", "Noted.", "Later."]);
    expect(await db.turn.count({ where: { conversation: { externalId: { startsWith: "again-" } } } })).toBe(4);

    const changed = await importLines("again-changed", [line("again-2", [{ role: "user", content: "Second, edited." }])]);
    expect(changed[0].error).toBe("Conversation again-2 already has messages other than these; import only into a new one.");

    const IMPORT = `mutation($input: ImportConversationInput!) { importConversation(input: $input) { id lastSeq } }`;
    const retried = await engram.gql(IMPORT, { input: { ...file[1], messages: [{ role: "USER", content: "Second.", occurredAt: "2025-03-01T10:00:00Z" }] } });
    expect(retried.errors).toBeUndefined();
    expect(retried.data.importConversation).toEqual({ id: first[1].conversationId, lastSeq: 1 });

    // Nor does the file bring back what was forgotten since.
    const user = await db.endUser.findFirstOrThrow({ where: { externalId: "dana" } });
    const forgot = await engram.gql(`mutation($id: ID!) { forgetUser(endUserId: $id) { messages } }`, { id: user.id });
    expect(forgot.errors).toBeUndefined();
    const afterForget = await importLines("again", file);
    expect(afterForget.map((r) => [r.already, r.error])).toEqual([[true, undefined], [true, undefined]]);
    expect(await db.message.count({ where: { conversation: { endUserId: user.id }, forgottenAt: null } })).toBe(0);
  });

  // The README said "nothing forgotten since comes back"; a deleted conversation leaves no row to
  // compare with, so its line is a new import: the README now says so and to take such lines out.
  it("imports a conversation deleted since as a new one, as the README warns", async () => {
    const file = [line("deleted-1", [{ role: "user", content: "Delete me later." }])];
    const [first] = await importLines("deleted", file);
    const deleted = await engram.gql(`mutation($id: ID!) { deleteConversation(id: $id) { messages } }`, { id: first.conversationId });
    expect(deleted.errors).toBeUndefined();
    const [again] = await importLines("deleted", file);
    expect([again.messages, again.already, again.error]).toEqual([1, undefined, undefined]);
    expect(again.conversationId).not.toBe(first.conversationId);
  });
});
