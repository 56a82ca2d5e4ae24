import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant, type TenantDb } from "../src/db.ts";
import { LIMITS } from "../src/limits.ts";
import { endUserNamed, keysetLists, nextPage } from "../src/memory/export.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { IMPORT } from "./helpers/recall.ts";

// GET /export/users/:id streams exportUser's document a page at a time; exportUser itself
// answers only up to LIMITS.exportRowsMax rows of history and names the stream above it.

const EXPORT = `query($id: ID!) { exportUser(endUserId: $id) }`;

let engram: TestEngram;
let base: string;
let db: TenantDb;

beforeAll(async () => {
  engram = await startTestEngram();
  base = await engram.listen();
  db = forTenant(engram.services.db, engram.tenant.tenantId);
}, 120_000);
afterAll(() => engram?.stop());

const streamed = (endUserId: string, key: string | null = engram.tenant.admin, init: RequestInit = {}) =>
  fetch(`${base}/export/users/${encodeURIComponent(endUserId)}`, { ...init, headers: key ? { authorization: `Bearer ${key}` } : {} });

/** A conversation imported through the API, with `messages` messages; its ids. */
async function importConversation(user: string, conversation: string, messages: { role: string; content: string; private?: boolean }[]) {
  const { data, errors } = await engram.gql(IMPORT, {
    input: {
      agentExternalId: "shop",
      endUserExternalId: user,
      conversationExternalId: conversation,
      messages: messages.map((m, i) => ({ ...m, occurredAt: new Date(Date.UTC(2025, 0, 1, 9, i)).toISOString() })),
    },
  });
  expect(errors).toBeUndefined();
  return { conversationId: data.importConversation.id as string, endUserId: data.importConversation.endUser.id as string };
}

/** Messages seq from..to of a conversation, in one insert through the tenant's client. */
async function addMessages(conversationId: string, from: number, to: number) {
  const data = Array.from({ length: to - from + 1 }, (_, i) => {
    const seq = from + i;
    return {
      tenantId: db.$tenantId(),
      conversationId,
      seq,
      role: seq % 2 ? ("USER" as const) : ("ASSISTANT" as const),
      content: `Message ${seq} of a long history: the order for table ${seq % 17}.`,
      occurredAt: new Date(Date.UTC(2024, 0, 1) + seq * 60_000),
    };
  });
  await db.message.createMany({ data });
  await db.conversation.update({ where: { id: conversationId }, data: { lastSeq: to } });
}

/** Snippets sharing three times between them, so a page boundary falls inside a tie. */
async function addSnippets(endUserId: string, conversationId: string, count: number) {
  await db.recallSnippet.createMany({
    data: Array.from({ length: count }, (_, i) => ({
      tenantId: db.$tenantId(),
      endUserId,
      conversationId,
      kind: "TURN" as const,
      text: `Snippet ${i}`,
      messageIds: [],
      occurredAt: new Date(Date.UTC(2024, 5, 1 + (i % 3))),
    })),
  });
}

async function addEvents(externalId: string, count: number) {
  await db.memoryEvent.createMany({
    data: Array.from({ length: count }, (_, i) => ({
      tenantId: db.$tenantId(),
      scope: "ENTITY" as const,
      scopeRef: externalId,
      kind: "note",
      body: `Event ${i}`,
      source: "crm",
      occurredAt: new Date(Date.UTC(2024, 6, 1 + (i % 2))),
    })),
  });
}

/** A README code block, by its `<!-- readme-test: name -->` marker. */
function readmeBlock(name: string): string {
  const match = new RegExp(`<!-- readme-test: ${name} -->\\n\`\`\`\\w+\\n([\\s\\S]*?)\\n\`\`\``).exec(readFileSync("README.md", "utf8"));
  if (!match) throw new Error(`README.md has no block marked readme-test: ${name}`);
  return match[1];
}

const withoutTime = ({ exportedAt: _, ...document }: Record<string, unknown>) => document;

describe("GET /export/users/:endUserId", () => {
  it("streams the document exportUser answers, for an admin key", async () => {
    const user = "quinn";
    const first = await importConversation(user, `${user}-1`, [
      { role: "USER", content: "I always book the corner table." },
      { role: "ASSISTANT", content: "Noted: the corner table." },
      { role: "ASSISTANT", content: "(checked the booking system)", private: true },
      { role: "USER", content: "And no cilantro, please." },
    ]);
    const { endUserId } = first;
    const second = await importConversation(user, `${user}-2`, [
      { role: "USER", content: "Same table as last time?" },
      { role: "ASSISTANT", content: "The corner one, yes." },
    ]);
    const fact = await engram.gql(`mutation($input: AddFactInput!) { addFact(input: $input) { id } }`, { input: { endUserId, text: "The user books the corner table." } });
    await engram.gql(`mutation($id: ID!) { correctFact(id: $id, input: {text: "The user always books the corner table."}) { id } }`, { id: fact.data.addFact.id });
    await engram.gql(`mutation { createEntry(input: {scope: ENTITY, scopeRef: "${user}", title: "Corner table", summary: "Seat Quinn in the corner."}) { id } }`);
    await engram.gql(`mutation { appendEvent(input: {scope: ENTITY, scopeRef: "${user}", kind: "note", body: "Asked for the corner again.", source: "crm", sourceRef: "quinn-1"}) { id } }`);
    await db.summaryRevision.createMany({
      data: [1, 2].map((n) => ({ tenantId: db.$tenantId(), conversationId: first.conversationId, text: `Summary ${n}`, words: 2, coveredThroughSeq: 2 * n, accepted: n === 2, createdAt: new Date(Date.UTC(2025, 0, 2, n)) })),
    });
    await addSnippets(endUserId, second.conversationId, 3);
    await db.message.updateMany({ where: { conversationId: first.conversationId, seq: 4 }, data: { forgottenAt: new Date() } });

    const response = await streamed(endUserId);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toMatch(/^application\/json/);
    expect(response.headers.get("content-disposition")).toBe(`attachment; filename="engram-export-${endUserId}.json"`);
    const document = await response.json();
    const { data, errors } = await engram.gql(EXPORT, { id: endUserId });
    expect(errors).toBeUndefined();
    expect(withoutTime(document)).toEqual(withoutTime(data.exportUser));
    // Not two empty documents: everything planted is there.
    expect(document.endUser).toMatchObject({ id: endUserId, externalId: user });
    expect(document.facts).toEqual([expect.objectContaining({ text: "The user always books the corner table.", versions: [expect.anything(), expect.anything()] })]);
    expect(document.conversations.map((c: any) => c.messages.map((m: any) => m.seq))).toEqual([[1, 2, 3, 4], [1, 2]]);
    expect(document.conversations[0].messages[2]).toMatchObject({ private: true, content: "(checked the booking system)" });
    expect(document.conversations[0].messages[3].forgottenAt).toEqual(expect.any(String));
    expect(document.conversations[0].revisions).toEqual([expect.objectContaining({ text: "Summary 1" }), expect.objectContaining({ text: "Summary 2", accepted: true })]);
    expect(document.snippets).toHaveLength(3);
    expect(document.entries).toEqual([expect.objectContaining({ title: "Corner table" })]);
    expect(document.events).toEqual([expect.objectContaining({ body: "Asked for the corner again." })]);

    // The README's example, as written, with the test server's address.
    const dir = mkdtempSync(path.join(tmpdir(), "engram-export-"));
    try {
      await promisify(execFile)("bash", ["-euo", "pipefail", "-c", readmeBlock("export-user").replaceAll("http://127.0.0.1:4000", base)], {
        cwd: dir,
        env: { ...process.env, END_USER_ID: endUserId, ENGRAM_ADMIN_KEY: engram.tenant.admin },
        timeout: 30_000,
      });
      expect(withoutTime(JSON.parse(readFileSync(path.join(dir, "export.json"), "utf8")))).toEqual(withoutTime(document));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }

    // Each export is audited before its first row: who took whose data, and how.
    const audited = await engram.services.db.auditLog.findMany({
      where: { tenantId: engram.tenant.tenantId, action: "memory.export", changes: { path: ["target", "endUserId"], equals: endUserId } },
      orderBy: { createdAt: "asc" },
    });
    const adminKey = await engram.services.db.apiKey.findFirstOrThrow({ where: { tenantId: engram.tenant.tenantId, role: "ADMIN" } });
    expect(audited.map((row) => [row.apiKeyId, (row.changes as { via: string }).via])).toEqual([
      [adminKey.id, "stream"],
      [adminKey.id, "graphql"],
      [adminKey.id, "stream"],
    ]);
    expect(audited[0].changes).toMatchObject({ target: { endUserId, externalId: user } });
  }, 60_000);

  it("answers typed errors: 401 without a valid key, 403 for reader and writer keys, 404 for another tenant's user or none", async () => {
    const { endUserId } = await importConversation("rosa", "rosa-1", [{ role: "USER", content: "Hello." }]);
    const expectError = async (response: Response, status: number, code: string) => {
      expect(response.status).toBe(status);
      expect((await response.json()).errors[0].extensions.code).toBe(code);
    };
    await expectError(await streamed(endUserId, null), 401, "UNAUTHENTICATED");
    await expectError(await streamed(endUserId, "engram_not-a-key"), 401, "UNAUTHENTICATED");
    await expectError(await streamed(endUserId, engram.tenant.reader), 403, "FORBIDDEN");
    await expectError(await streamed(endUserId, engram.tenant.writer), 403, "FORBIDDEN");
    await expectError(await streamed(endUserId, engram.other.admin), 404, "NOT_FOUND");
    await expectError(await streamed(randomUUID()), 404, "NOT_FOUND");
    await expectError(await streamed(endUserId, engram.tenant.admin, { method: "POST" }), 405, "METHOD_NOT_ALLOWED");
    await expectError(await fetch(`${base}/export/users/${endUserId}/more`, { headers: { authorization: `Bearer ${engram.tenant.admin}` } }), 404, "NOT_FOUND");
    // One exportUser a request: aliases cannot gather several users' 5,000 rows into one reply.
    const twice = await engram.gql(`query($id: ID!) { a: exportUser(endUserId: $id) b: exportUser(endUserId: $id) }`, { id: endUserId });
    expect(twice.errors?.[0]).toMatchObject({ extensions: { code: "QUERY_TOO_COMPLEX" } });
    expect(twice.errors?.[0].message).toMatch(/at most 1 exportUser per request/);
    // A refused export took nothing, and is not recorded as one.
    expect(await engram.services.db.auditLog.count({ where: { action: "memory.export", changes: { path: ["target", "endUserId"], equals: endUserId } } })).toBe(0);
  });
});

// `engram export-user <name>` matched the external id or the id at once (findFirst of an OR): a
// user whose external id spelt another person's id could be handed that person's export.
describe("a key revoked while its export streams", () => {
  it("cuts the export short within about a second: what is read after that never parses as a whole document", async () => {
    // 720 messages of 50,000 characters: 36 MB, far more than the loopback socket's buffers hold
    // (about 12 MB went into them here), so the server is still writing when its paused reader goes on.
    const { conversationId, endUserId } = await importConversation("rio", "rio-big", [{ role: "USER", content: "Hi." }]);
    const long = "x".repeat(50_000);
    await db.message.createMany({
      data: Array.from({ length: 720 }, (_, i) => ({
        tenantId: db.$tenantId(),
        conversationId,
        seq: i + 2,
        role: "USER" as const,
        content: `${i} ${long}`,
        occurredAt: new Date(Date.UTC(2025, 1, 1) + i * 60_000),
      })),
    });
    await db.conversation.update({ where: { id: conversationId }, data: { lastSeq: 721 } });
    const made = await engram.gql(`mutation { createApiKey(role: ADMIN, name: "exporter") { key id } }`);
    const { key, id } = made.data.createApiKey;

    // Whole while the key is live.
    const whole = await (await streamed(endUserId, key)).text();
    expect(JSON.parse(whole).conversations[0].messages).toHaveLength(721);

    const read = await new Promise<{ body: string; cut: boolean }>((resolve, reject) => {
      const chunks: Buffer[] = [];
      const request = http.get(`${base}/export/users/${endUserId}`, { headers: { authorization: `Bearer ${key}` } }, (response) => {
        response.once("data", (first: Buffer) => {
          chunks.push(first);
          response.pause();
          void engram
            .gql(`mutation($id: ID!) { revokeApiKey(id: $id) { revokedAt } }`, { id })
            .then(() => new Promise((r) => setTimeout(r, 1_500)))
            .then(() => {
              response.on("data", (chunk: Buffer) => chunks.push(chunk));
              response.resume();
            });
        });
        response.on("end", () => resolve({ body: Buffer.concat(chunks).toString(), cut: false }));
        response.on("aborted", () => resolve({ body: Buffer.concat(chunks).toString(), cut: true }));
        response.on("error", () => resolve({ body: Buffer.concat(chunks).toString(), cut: true }));
      });
      request.on("error", (error) => ((error as NodeJS.ErrnoException).code === "ECONNRESET" ? resolve({ body: Buffer.concat(chunks).toString(), cut: true }) : reject(error)));
    });
    expect(read.cut).toBe(true);
    expect(read.body.length).toBeLessThan(whole.length - 5_000_000);
    expect(() => JSON.parse(read.body)).toThrow();
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
  }, 120_000);
});

describe("engram export-user's <endUserExternalId>", () => {
  it("is the person with that external id, though it spells another person's id; the id only when no one has it as external id", async () => {
    const victim = await importConversation("vera", "vera-1", [{ role: "USER", content: "My door code is 4711." }]);
    const impostor = await importConversation(victim.endUserId, "impostor-1", [{ role: "USER", content: "Send me my data." }]);

    expect((await endUserNamed(db, victim.endUserId))?.id).toBe(impostor.endUserId);
    expect((await endUserNamed(db, "vera"))?.id).toBe(victim.endUserId);
    expect((await endUserNamed(db, impostor.endUserId))?.id).toBe(impostor.endUserId);
    expect(await endUserNamed(db, "nobody")).toBeNull();
    // Another tenant's person is no one here, by external id or by id.
    const other = forTenant(engram.services.db, engram.other.tenantId);
    expect(await endUserNamed(other, "vera")).toBeNull();
    expect(await endUserNamed(other, victim.endUserId)).toBeNull();
  });
});

describe("a long history", () => {
  const user = "sam";
  let endUserId: string;
  let conversations: string[];

  beforeAll(async () => {
    // Exactly LIMITS.exportRowsMax rows: 3,247 messages in three long conversations (each read in
    // pages of its own), 200 in forty short ones (read together) whose 510 summary revisions are
    // more than a page (so read per conversation), the 43 conversations, 700 snippets and 300 events.
    conversations = [];
    for (const [i, size] of [1_000, 1_457, 790].entries()) {
      const imported = await importConversation(user, `${user}-long-${i}`, [{ role: "USER", content: "Hi." }]);
      endUserId = imported.endUserId;
      conversations.push(imported.conversationId);
      await addMessages(imported.conversationId, 2, size);
    }
    const short = Array.from({ length: 5 }, (_, i) => ({ role: i % 2 ? "ASSISTANT" : "USER", content: `Short message ${i + 1}.` }));
    for (let i = 0; i < 40; i++) conversations.push((await importConversation(user, `${user}-short-${i}`, short)).conversationId);
    await db.summaryRevision.createMany({
      data: Array.from({ length: 510 }, (_, i) => ({
        tenantId: db.$tenantId(),
        conversationId: conversations[3 + (i % 40)],
        text: `Revision ${i}`,
        words: 2,
        coveredThroughSeq: 5,
        accepted: i % 2 === 0,
        createdAt: new Date(Date.UTC(2025, 1, 1) + i * 1_000),
      })),
    });
    await addSnippets(endUserId, conversations[0], 700);
    await addEvents(user, 300);
  }, 180_000);

  it("exportUser answers up to the limit, and refuses one row over it with the streaming path, which has every row", async () => {
    expect(LIMITS.exportRowsMax).toBe(5_000);
    const atLimit = await engram.gql(EXPORT, { id: endUserId });
    expect(atLimit.errors).toBeUndefined();
    expect(withoutTime(atLimit.data.exportUser)).toEqual(withoutTime(await (await streamed(endUserId)).json()));

    await addMessages(conversations[2], 791, 1_791);
    const over = await engram.gql(EXPORT, { id: endUserId });
    expect(over.data).toBeNull();
    expect(over.errors?.[0].extensions).toMatchObject({ code: "EXPORT_TOO_LARGE", rows: 6_001, limit: 5_000, path: `/export/users/${endUserId}` });
    expect(over.errors?.[0].message).toContain(`GET /export/users/${endUserId}`);

    const response = await streamed(endUserId);
    expect(response.status).toBe(200);
    const document = await response.json();
    expect(document.conversations.map((c: any) => c.id)).toEqual(conversations);
    // Pages of 500 by seq: every message once, in order, across page boundaries (1,000 is two full pages and an empty one).
    const upTo = (size: number) => Array.from({ length: size }, (_, i) => i + 1);
    const seqs = document.conversations.map((c: any) => c.messages.map((m: any) => m.seq));
    expect(seqs).toEqual([upTo(1_000), upTo(1_457), upTo(1_791), ...Array(40).fill(upTo(5))]);
    expect(document.conversations[2].messages[1_790].content).toBe("Message 1791 of a long history: the order for table 6.");
    const revisions = await db.summaryRevision.findMany({ where: { conversation: { endUserId } }, orderBy: [{ createdAt: "asc" }, { id: "asc" }], select: { conversationId: true, text: true } });
    expect(document.conversations.map((c: any) => c.revisions.map((r: any) => r.text))).toEqual(
      conversations.map((id) => revisions.filter((r) => r.conversationId === id).map((r) => r.text)),
    );
    // Pages by (occurredAt, id), with ties crossing page boundaries: each row once, in the store's order.
    const snippets = await db.recallSnippet.findMany({ where: { endUserId }, orderBy: [{ occurredAt: "asc" }, { id: "asc" }], select: { id: true } });
    expect(document.snippets.map((s: any) => s.id)).toEqual(snippets.map((s) => s.id));
    const events = await db.memoryEvent.findMany({ where: { scope: "ENTITY", scopeRef: user }, orderBy: [{ occurredAt: "asc" }, { id: "asc" }], select: { id: true } });
    expect(document.events.map((e: any) => e.id)).toEqual(events.map((e) => e.id));
  }, 120_000);

  it("stops reading when its client goes away, and the server answers the next request", async () => {
    await new Promise<void>((resolve, reject) => {
      const request = http.get(`${base}/export/users/${endUserId}`, { headers: { authorization: `Bearer ${engram.tenant.admin}` } }, (response) => {
        response.once("data", () => {
          request.destroy();
          resolve();
        });
      });
      request.on("error", (error) => (error.message.includes("aborted") || (error as NodeJS.ErrnoException).code === "ECONNRESET" ? resolve() : reject(error)));
    });
    const response = await streamed(endUserId, engram.tenant.reader);
    expect(response.status).toBe(403);
    const health = await fetch(`${base}/healthz`);
    expect(health.status).toBe(200);
  }, 60_000);
});

describe("pages by (time, id)", () => {
  const user = "tia";
  const SIZE = 1_001;
  const at = new Date(Date.UTC(2024, 2, 1));
  let endUserId: string;
  let longConversation: string;
  const many = <T>(row: (i: number) => T) => Array.from({ length: SIZE }, (_, i) => row(i));

  beforeAll(async () => {
    // Two full pages and one row of each list, every row at the same time: each boundary falls inside the tie.
    ({ endUserId, conversationId: longConversation } = await importConversation(user, `${user}-1`, [{ role: "USER", content: "Hi." }]));
    const { agentId } = await db.conversation.findUniqueOrThrow({ where: { id: longConversation }, select: { agentId: true } });
    const tenantId = db.$tenantId();
    await db.conversation.createMany({ data: many((i) => ({ tenantId, agentId, endUserId, externalId: `${user}-tied-${i}`, createdAt: at })) });
    await db.recallSnippet.createMany({ data: many((i) => ({ tenantId, endUserId, conversationId: longConversation, kind: "TURN" as const, text: `Snippet ${i}`, messageIds: [], occurredAt: at })) });
    await db.memoryEntry.createMany({
      data: many((i) => ({ tenantId, scope: "ENTITY" as const, scopeRef: user, title: `Entry ${i}`, summary: "Tied.", tags: [], importance: 1, source: "MANUAL" as const, createdAt: at })),
    });
    await db.memoryEvent.createMany({ data: many((i) => ({ tenantId, scope: "ENTITY" as const, scopeRef: user, kind: "note", body: `Event ${i}`, source: "crm", occurredAt: at })) });
    await db.summaryRevision.createMany({
      data: many((i) => ({ tenantId, conversationId: longConversation, text: `Revision ${i}`, words: 2, coveredThroughSeq: 1, accepted: false, createdAt: at })),
    });
  }, 120_000);

  it("has every row once, in the store's order, when one time ties across page boundaries", async () => {
    const response = await streamed(endUserId);
    expect(response.status).toBe(200);
    const document = await response.json();
    const ids = (rows: { id: string }[]) => rows.map((row) => row.id);
    const conversations = await db.conversation.findMany({ where: { endUserId }, orderBy: [{ createdAt: "asc" }, { id: "asc" }], select: { id: true } });
    expect(ids(document.conversations)).toEqual(ids(conversations));
    expect(conversations).toHaveLength(SIZE + 1);
    const snippets = await db.recallSnippet.findMany({ where: { endUserId }, orderBy: [{ occurredAt: "asc" }, { id: "asc" }], select: { id: true } });
    expect(ids(document.snippets)).toEqual(ids(snippets));
    const entries = await db.memoryEntry.findMany({ where: { scope: "ENTITY", scopeRef: user }, orderBy: [{ createdAt: "desc" }, { id: "desc" }], select: { id: true } });
    expect(ids(document.entries)).toEqual(ids(entries));
    const events = await db.memoryEvent.findMany({ where: { scope: "ENTITY", scopeRef: user }, orderBy: [{ occurredAt: "asc" }, { id: "asc" }], select: { id: true } });
    expect(ids(document.events)).toEqual(ids(events));
    const revisions = await db.summaryRevision.findMany({ where: { conversationId: longConversation }, orderBy: [{ createdAt: "asc" }, { id: "asc" }], select: { text: true } });
    const exported = document.conversations.find((c: { id: string }) => c.id === longConversation);
    expect(exported.revisions.map((r: { text: string }) => r.text)).toEqual(revisions.map((r) => r.text));
    for (const list of [snippets, entries, events, revisions]) expect(list).toHaveLength(SIZE);
  }, 60_000);

  it("starts each page inside its index (migration 0017): the keyset bounds the scan, no row before the page is read", async () => {
    const after = { id: randomUUID(), at };
    const lists = [
      [keysetLists.conversations(endUserId), "Conversation_tenantId_endUserId_createdAt_id_idx"],
      [keysetLists.revisions(longConversation), "SummaryRevision_conversationId_createdAt_id_idx"],
      [keysetLists.snippets(endUserId), "RecallSnippet_tenantId_endUserId_occurredAt_id_idx"],
      [keysetLists.entries(user), "MemoryEntry_tenantId_scope_scopeRef_createdAt_id_idx"],
      [keysetLists.events(user), "MemoryEvent_tenantId_scope_scopeRef_occurredAt_id_idx"],
    ] as const;
    for (const [list, index] of lists) {
      // Tables this small are cheaper to read whole: the planner is told not to, to show what it does with a person's 100,000 rows.
      const [, , plan] = await db.$transaction([
        db.$executeRaw`SET LOCAL enable_seqscan = off`,
        db.$executeRaw`SET LOCAL enable_bitmapscan = off`,
        db.$queryRaw<{ "QUERY PLAN": string }[]>`EXPLAIN ${nextPage(db, list, after)}`,
      ]);
      const text = plan.map((line) => line["QUERY PLAN"]).join("\n");
      expect(text, list.table).toMatch(new RegExp(`Index (Only )?Scan (Backward )?using "${index}"`));
      expect(text, list.table).toMatch(/Index Cond: .*ROW\("(createdAt|occurredAt)", id\) [<>] ROW\(/);
      expect(text, list.table).not.toMatch(/Sort/);
    }
    // Each replaced the index on its leading columns alone.
    const indexes = await engram.services.db.$queryRaw<{ indexname: string }[]>`SELECT indexname::text FROM pg_indexes WHERE schemaname = current_schema()`;
    const names = indexes.map((row) => row.indexname);
    expect(names).toEqual(expect.arrayContaining(lists.map(([, index]) => index)));
    for (const replaced of ["Conversation_tenantId_endUserId_idx", "SummaryRevision_conversationId_createdAt_idx", "RecallSnippet_tenantId_endUserId_idx", "MemoryEntry_tenantId_scope_scopeRef_idx", "MemoryEvent_tenantId_scope_scopeRef_occurredAt_idx"]) {
      expect(names).not.toContain(replaced);
    }
  });
});
