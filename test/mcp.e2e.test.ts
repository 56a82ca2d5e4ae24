import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { EngramClient } from "engram/client";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { allIndexed, INDEXING_TIMEOUT_MS } from "./helpers/recall.ts";
import { ensureCompiled } from "./helpers/server-process.ts";

// The MCP server, driven by the SDK's own client over streamable HTTP (/mcp) and over stdio
// (`engram mcp` as a child process), against a real Engram.
let engram: TestEngram;
let url: string;
let engramClient: EngramClient;
const open: Client[] = [];

beforeAll(async () => {
  ensureCompiled(); // `engram mcp` runs the compiled CLI
  engram = await startTestEngram({ worker: true });
  url = await engram.listen();
  engramClient = new EngramClient({ url, apiKey: engram.tenant.writer });
  await engramClient.recordTurn({
    agentExternalId: "shop",
    endUserExternalId: "ana",
    conversationExternalId: "ana-1",
    userMessage: "Please ship the kayak paddles to my office in Lisbon.",
    assistantMessage: "The kayak paddles ship to your Lisbon office.",
  });
  await engramClient.createEntry({ scope: "ENTITY", scopeRef: "acme", title: "Acme ROAS target", summary: "Acme wants ROAS above 3.", tags: ["ads"] });
  await allIndexed(engram, undefined, INDEXING_TIMEOUT_MS);
}, INDEXING_TIMEOUT_MS + 60_000);
afterAll(async () => {
  for (const client of open) await client.close().catch(() => {});
  await engram?.stop();
});

async function overHttp(key: string | null) {
  const client = new Client({ name: "engram-test", version: "1.0.0" });
  const headers: Record<string, string> = key ? { authorization: `Bearer ${key}` } : {};
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp`), { requestInit: { headers } }));
  open.push(client);
  return client;
}

async function overStdio(key: string) {
  const client = new Client({ name: "engram-test", version: "1.0.0" });
  const env = { ...(process.env as Record<string, string>), ENGRAM_URL: url, ENGRAM_API_KEY: key };
  await client.connect(new StdioClientTransport({ command: process.execPath, args: [path.resolve("bin/engram.mjs"), "mcp"], env, stderr: "pipe" }));
  open.push(client);
  return client;
}

type ToolResult = { isError?: boolean; content: { type: string; text: string }[]; structuredContent?: any };
const call = async (client: Client, name: string, args: Record<string, unknown>) =>
  (await client.callTool({ name, arguments: args })) as ToolResult;

describe("MCP over streamable HTTP at /mcp", () => {
  it("lists the memory tools with JSON-schema inputs and short descriptions", async () => {
    const client = await overHttp(engram.tenant.reader);
    const { tools } = await client.listTools();
    expect(tools.map((t) => t.name).sort()).toEqual(["append_event", "forget", "get_context", "recall", "remember", "search_memory"]);
    for (const tool of tools) {
      expect(tool.inputSchema.type).toBe("object");
      expect(tool.description!.length).toBeLessThan(200);
    }
    const remember = tools.find((t) => t.name === "remember")!;
    expect(remember.inputSchema.required).toEqual(["user", "fact"]);
  });

  it("remembers, searches, reads context and forgets, through the GraphQL API", async () => {
    const client = await overHttp(engram.tenant.writer);
    const remembered = await call(client, "remember", { user: "ana", fact: "Ana paddles a sea kayak every weekend.", core: true });
    expect(remembered.isError).toBeFalsy();
    const factId = remembered.structuredContent.factId;

    const resource = await client.readResource({ uri: "engram://users/ana/facts" });
    expect(JSON.parse((resource.contents[0] as { text: string }).text)).toEqual([expect.objectContaining({ id: factId, core: true })]);

    const entries = await call(client, "search_memory", { query: "ROAS", scope: "ENTITY" });
    expect(entries.structuredContent).toEqual({ entries: [expect.objectContaining({ title: "Acme ROAS target" })], facts: [] });
    const facts = await call(client, "search_memory", { query: "kayak", user: "ana" });
    expect(facts.structuredContent).toEqual({ entries: [], facts: [expect.objectContaining({ id: factId })] });

    const context = await call(client, "get_context", { conversation: "ana-1", message: "Where do my paddles go?" });
    expect(context.content[0].text).toContain("Ana paddles a sea kayak every weekend.");
    expect(context.content[0].text).toContain("Lisbon");

    // A conversation with no turns yet: by the user's and agent's ids, what Engram knows about the user.
    const fresh = await call(client, "get_context", { conversation: "ana-new", user: "ana", agent: "shop", message: "Any plans this weekend?" });
    expect(fresh.content[0].text).toContain("Ana paddles a sea kayak every weekend.");
    expect((await call(client, "get_context", { conversation: "ana-new", message: "hi" })).content[0].text).toMatch(/give user and agent/);
    expect((await call(client, "get_context", { conversation: "ana-new", user: "ana", message: "hi" })).content[0].text).toMatch(/^BAD_USER_INPUT: /);

    const recall = await call(client, "recall", { user: "ana", query: "Where were the kayak paddles shipped?" });
    expect(recall.structuredContent.snippets[0].text).toContain("Lisbon office");

    const event = await call(client, "append_event", { scope: "ENTITY", scopeRef: "acme", kind: "decision", body: "Raise ROAS to 4.", sourceRef: "mcp-1" });
    const again = await call(client, "append_event", { scope: "ENTITY", scopeRef: "acme", kind: "decision", body: "Raise ROAS to 4.", sourceRef: "mcp-1" });
    expect(again.structuredContent.eventId).toBe(event.structuredContent.eventId);

    const summary = await client.readResource({ uri: "engram://conversations/ana-1/summary" });
    expect(summary.contents[0]).toMatchObject({ mimeType: "text/plain" });

    const forgotten = await call(client, "forget", { user: "ana", factId });
    expect(forgotten.structuredContent.forgotten.factId).toBe(factId);
    expect(await engramClient.facts((await engramClient.endUser("ana"))!.id)).toEqual([]);
  });

  it("forgets everything about a user, and says all it deleted: messages, entries and events about them too", async () => {
    const client = await overHttp(engram.tenant.writer);
    await engramClient.recordTurn({ agentExternalId: "shop", endUserExternalId: "bo", conversationExternalId: "bo-1", userMessage: "I moved to Porto.", assistantMessage: "Noted." });
    await call(client, "remember", { user: "bo", fact: "Bo lives in Porto." });
    await engramClient.appendEvent({ scope: "ENTITY", scopeRef: "bo", kind: "note", body: "Called about the move.", source: "crm" });
    const forgotten = (await call(client, "forget", { user: "bo", everything: true })).structuredContent.forgotten;
    expect(forgotten).toMatchObject({ facts: 1, messages: 2, events: 1 });
    for (const count of ["entries", "summaries", "summaryRevisions", "snippets", "factVersions", "gateVerdicts", "activity"]) expect(forgotten).toHaveProperty(count);
  });

  it("keeps the key's role: a reader may read but not forget or remember", async () => {
    const writer = await overHttp(engram.tenant.writer);
    const factId = (await call(writer, "remember", { user: "ana", fact: "Ana is allergic to nuts." })).structuredContent.factId;
    const reader = await overHttp(engram.tenant.reader);
    const refused = await call(reader, "forget", { user: "ana", factId });
    expect(refused.isError).toBe(true);
    expect(refused.content[0].text).toMatch(/^FORBIDDEN: /);
    expect((await call(reader, "remember", { user: "ana", fact: "Ana likes tea." })).content[0].text).toMatch(/^FORBIDDEN: /);
    expect(await engramClient.facts((await engramClient.endUser("ana"))!.id)).toHaveLength(1);
    expect((await call(reader, "get_context", { conversation: "ana-1", message: "hi" })).isError).toBeFalsy();
  });

  it("refuses a body over the request limit with HTTP 413 in JSON-RPC's shape", async () => {
    const response = await fetch(`${url}/mcp`, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream", authorization: `Bearer ${engram.tenant.writer}` },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: "recall", arguments: { user: "ana", query: "x".repeat(1_000_100) } } }),
    });
    expect(response.status).toBe(413);
    expect(await response.json()).toMatchObject({ jsonrpc: "2.0", id: null, error: { code: -32600, message: expect.stringMatching(/^BAD_USER_INPUT: /) } });
  });

  it("keeps tenants apart and refuses requests without a valid key", async () => {
    const other = await overHttp(engram.other.writer);
    expect((await call(other, "recall", { user: "ana", query: "kayak" })).content[0].text).toMatch(/^NOT_FOUND: /);
    await expect(overHttp(null)).rejects.toThrow(/401|API key/);
    await expect(overHttp("egm_not-a-key")).rejects.toThrow(/401|API key/);
  });

  it("takes POST only, one message at a time: no stream to hold open, no batch of tool calls", async () => {
    const headers = { authorization: `Bearer ${engram.tenant.reader}`, accept: "application/json, text/event-stream", "content-type": "application/json" };
    const stream = await fetch(`${url}/mcp`, { method: "GET", headers });
    expect(stream.status).toBe(405);
    expect(stream.headers.get("allow")).toBe("POST");
    const ping = (id: number) => ({ jsonrpc: "2.0", id, method: "ping" });
    const batch = await fetch(`${url}/mcp`, { method: "POST", headers, body: JSON.stringify([ping(1), ping(2)]) });
    expect(batch.status).toBe(400);
    expect((await batch.json()).error.message).toMatch(/Batches are not accepted/);
    const broken = await fetch(`${url}/mcp`, { method: "POST", headers, body: "{not json" });
    expect((await broken.json()).error.code).toBe(-32700);
  });

  it("gives bad arguments back as errors the agent can read", async () => {
    const client = await overHttp(engram.tenant.writer);
    expect((await call(client, "forget", { user: "ana" })).content[0].text).toMatch(/^BAD_USER_INPUT: /);
    const tooShort = await call(client, "remember", { user: "ana", fact: "x" });
    expect(tooShort.isError).toBe(true);
  });

  it("refuses a fact the API would refuse before creating its end user", async () => {
    const client = await overHttp(engram.tenant.writer);
    // Two characters once trimmed (as the API trims), a NUL, a lone surrogate.
    for (const fact of ["   ab   ", "Ghost likes\u0000 tea.", "Ghost likes \ud800 tea."]) {
      expect((await call(client, "remember", { user: "ghost-1", fact })).isError, JSON.stringify(fact)).toBe(true);
    }
    expect(await engramClient.endUser("ghost-1")).toBeNull();
  });

  it("leaves no end user behind when the fact's write fails after the checks", async () => {
    const client = await overHttp(engram.tenant.writer);
    const db = engram.services.db;
    // The store refuses the fact's insert (as a full disk or a lost connection would): the tool's
    // schema and the API's validation have both passed by then.
    await db.$executeRawUnsafe(`
      CREATE FUNCTION "test_refuse_fact"() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN RAISE EXCEPTION 'test trigger refuses the fact'; END $$`);
    await db.$executeRawUnsafe(`CREATE TRIGGER "test_refuse_fact" BEFORE INSERT ON "Fact" FOR EACH ROW EXECUTE FUNCTION "test_refuse_fact"()`);
    try {
      const refused = await call(client, "remember", { user: "ghost-2", fact: "Ghost-2 collects old maps." });
      expect(refused.isError).toBe(true);
    } finally {
      await db.$executeRawUnsafe(`DROP TRIGGER IF EXISTS "test_refuse_fact" ON "Fact"`);
      await db.$executeRawUnsafe(`DROP FUNCTION IF EXISTS "test_refuse_fact"()`);
    }
    expect(await engramClient.endUser("ghost-2")).toBeNull();
    // Once the store takes it, the same call creates the user with the fact.
    const remembered = await call(client, "remember", { user: "ghost-2", fact: "Ghost-2 collects old maps." });
    expect(remembered.isError).toBeFalsy();
    expect(await engramClient.facts((await engramClient.endUser("ghost-2"))!.id)).toEqual([expect.objectContaining({ text: "Ghost-2 collects old maps." })]);
  });

  it("answers resource reads with typed errors: an unknown user is -32002 NOT_FOUND, a malformed URI InvalidParams", async () => {
    const read = async (uri: string) => {
      const response = await fetch(`${url}/mcp`, {
        method: "POST",
        headers: { authorization: `Bearer ${engram.tenant.reader}`, accept: "application/json, text/event-stream", "content-type": "application/json" },
        body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "resources/read", params: { uri } }),
      });
      return ((await response.json()) as { error: { code: number; message: string; data?: unknown } }).error;
    };
    expect(await read("engram://users/nobody/facts")).toMatchObject({ code: -32002, message: expect.stringMatching(/^NOT_FOUND: /), data: { code: "NOT_FOUND" } });
    expect(await read("engram://conversations/nowhere/summary")).toMatchObject({ code: -32002, message: expect.stringMatching(/^NOT_FOUND: /) });
    expect(await read("engram://users/%E0%A4%A/facts")).toMatchObject({ code: -32602, message: expect.stringMatching(/^BAD_USER_INPUT: /) });
  });
});

describe("MCP over stdio (engram mcp)", () => {
  it("serves the same tools against the running Engram with ENGRAM_API_KEY, roles included", async () => {
    const client = await overStdio(engram.tenant.reader);
    const { tools } = await client.listTools();
    expect(tools).toHaveLength(6);
    const recall = await call(client, "recall", { user: "ana", query: "kayak paddles" });
    expect(recall.structuredContent.snippets[0].text).toContain("kayak");
    const refused = await call(client, "forget", { user: "ana", everything: true });
    expect(refused.content[0].text).toMatch(/^FORBIDDEN: /);
    expect(await engramClient.facts((await engramClient.endUser("ana"))!.id)).not.toEqual([]);
  }, 180_000);
});
