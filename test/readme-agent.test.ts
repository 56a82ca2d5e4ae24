import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { startModelServer, type ModelServer } from "./helpers/model-server.ts";
import { allIndexed, INDEXING_TIMEOUT_MS } from "./helpers/recall.ts";

// Runs the code blocks of README.md's "Use it from your agent" section, found by their
// <!-- readme-test: name --> markers, against a real Engram: the README cannot drift.
const README = readFileSync(path.resolve("README.md"), "utf8");
const DEFAULT_URL = "http://127.0.0.1:4000";
const BLOCKS_DIR = path.resolve("test/.readme-blocks");

function block(name: string): string {
  const match = new RegExp(`<!-- readme-test: ${name} -->\\n\`\`\`\\w+\\n([\\s\\S]*?)\\n\`\`\``).exec(README);
  if (!match) throw new Error(`README.md has no block marked readme-test: ${name}`);
  return match[1];
}

let engram: TestEngram;
let model: ModelServer;
let url: string;
let run = 0;

/** Imports a TypeScript block as a module (top-level await and all), with the test server's URL, and returns what it logged. */
async function runTypeScript(name: string): Promise<string> {
  mkdirSync(BLOCKS_DIR, { recursive: true });
  const file = path.join(BLOCKS_DIR, `${name}-${++run}.ts`);
  writeFileSync(file, block(name).replaceAll(DEFAULT_URL, url));
  const logged: string[] = [];
  const spy = vi.spyOn(console, "log").mockImplementation((...args: unknown[]) => void logged.push(args.map((a) => (typeof a === "string" ? a : JSON.stringify(a))).join(" ")));
  try {
    await import(file);
  } finally {
    spy.mockRestore();
  }
  return logged.join("\n");
}

beforeAll(async () => {
  engram = await startTestEngram({ worker: true });
  url = await engram.listen();
  model = await startModelServer();
  process.env.ENGRAM_KEY = engram.tenant.writer;
  // The LangChain block's ChatOpenAI reads these, as it would read a real key and endpoint.
  process.env.OPENAI_API_KEY = "test-key";
  process.env.OPENAI_BASE_URL = model.url;
});
afterAll(async () => {
  rmSync(BLOCKS_DIR, { recursive: true, force: true });
  delete process.env.OPENAI_BASE_URL;
  await model?.stop();
  await engram?.stop();
});

describe("README: Use it from your agent", () => {
  it("runs the client example", async () => {
    const logged = await runTypeScript("client");
    expect(logged).toMatch(/TAIL: \d+ tokens/);
    expect(logged).toContain("1 entries about ROAS");
    expect(logged).toContain("NOT_FOUND");
    expect(await engram.services.db.memoryEvent.count({ where: { scopeRef: "acme", tenantId: engram.tenant.tenantId } })).toBe(1);
  });

  it("runs the subscription example", async () => {
    let done = false;
    const running = runTypeScript("subscribe").finally(() => (done = true));
    for (let i = 0; i < 100 && !done; i++) {
      await engram.gql(
        `mutation($input: AppendEventInput!) { appendEvent(input: $input) { id } }`,
        { input: { scope: "ENTITY", scopeRef: "acme", kind: "decision", body: `Decision ${i}`, source: "readme-test", sourceRef: `sub-${i}` } },
        engram.tenant.writer,
      );
      await new Promise((resolve) => setTimeout(resolve, 150));
    }
    expect(await running).toMatch(/^decision Decision \d+$/);
  });

  it("runs the LangChain example with the real ChatOpenAI against a scripted endpoint", async () => {
    await allIndexed(engram, undefined, INDEXING_TIMEOUT_MS);
    model.respond(() => "You ordered the blue trail running shoes, size 42.");
    const logged = await runTypeScript("langchain");
    expect(logged).toContain("You ordered the blue trail running shoes, size 42.");
    expect(logged).toContain("4 messages"); // the client example's turn and this one
    expect(logged).toContain("user: I ordered the blue trail running shoes, size 42."); // recalled
    const prompt = model.requests.at(-1)!.messages;
    expect(prompt[0].content).toContain("Ana runs trail races."); // the facts block
    expect(prompt.at(-1)!.content).toBe("Which shoes did I order last time?");
  }, INDEXING_TIMEOUT_MS + 60_000);

  it("runs the gate-verdict example: the verdict rides on the agent's own call and is stored", async () => {
    const before = model.requests.length;
    model.respond(() =>
      JSON.stringify({
        reply: "A chickpea curry: 30 minutes, one pot.",
        engram_gate: { remember: true, forget: "NONE", forgetTargets: [], needsRecall: false },
      }),
    );
    const logged = await runTypeScript("gate");
    expect(logged).toContain("A chickpea curry: 30 minutes, one pot.");
    // One model call, the agent's own: it was asked for the verdict with Engram's instructions and schema.
    const [call] = model.requests.slice(before);
    expect(model.requests.length - before).toBe(1);
    expect(call.messages[0].content).toContain("needsRecall: does answering need earlier conversations");
    expect(JSON.stringify(call.responseFormat)).toContain('"engram_gate":{');
    const conversation = await engram.services.db.conversation.findFirstOrThrow({ where: { externalId: "ben-1", tenantId: engram.tenant.tenantId } });
    await allIndexed(engram, undefined, INDEXING_TIMEOUT_MS);
    // The worker ran the turn's follow-ups and kept the caller's verdict.
    expect(await engram.services.db.gateVerdict.findMany({ where: { conversationId: conversation.id } })).toMatchObject([
      { decidedBy: "CALLER", remember: true, needsRecall: false },
    ]);

    // The recallIndexStatus query of "Recall of earlier conversations", as printed there.
    const query = /query \{ recallIndexStatus\(endUserExternalId: "guest-42"\) \{ pending oldestPendingAt \} \}/.exec(README)?.[0];
    expect(query).toBeDefined();
    const { externalId } = await engram.services.db.endUser.findUniqueOrThrow({ where: { id: conversation.endUserId } });
    const { data, errors } = await engram.gql(query!.replace("guest-42", externalId), {}, engram.tenant.reader);
    expect(errors).toBeUndefined();
    expect(data.recallIndexStatus).toEqual({ pending: 0, oldestPendingAt: null });
  }, INDEXING_TIMEOUT_MS + 60_000);

  it("runs the MCP desktop config (stdio) and the /mcp config (streamable HTTP)", async () => {
    const stdio = JSON.parse(block("mcp-stdio").replaceAll(DEFAULT_URL, url)).mcpServers.engram;
    const args = stdio.args.map((arg: string) => arg.replace("/path/to/engram", path.resolve(".")));
    const env = { ...(process.env as Record<string, string>), ...stdio.env, ENGRAM_API_KEY: engram.tenant.writer };
    const overStdio = new Client({ name: "readme", version: "1.0.0" });
    await overStdio.connect(new StdioClientTransport({ command: stdio.command === "node" ? process.execPath : stdio.command, args, env, stderr: "pipe" }));
    try {
      const remembered = (await overStdio.callTool({ name: "remember", arguments: { user: "ana", fact: "Ana prefers morning deliveries." } })) as { isError?: boolean };
      expect(remembered.isError).toBeFalsy();
    } finally {
      await overStdio.close();
    }

    // The one-line form: `VAR=value … npx engram mcp`, run as a shell would.
    const line = block("mcp-npx").trim().split(/\s+/);
    const assignments = Object.fromEntries(line.filter((word) => /^\w+=/.test(word)).map((word) => word.split("=") as [string, string]));
    const [command, ...commandArgs] = line.filter((word) => !/^\w+=/.test(word));
    expect(assignments).toEqual({ ENGRAM_API_KEY: "egm_your_writer_key" });
    const overNpx = new Client({ name: "readme", version: "1.0.0" });
    const npxEnv = { ...(process.env as Record<string, string>), ENGRAM_URL: url, ENGRAM_API_KEY: engram.tenant.reader };
    await overNpx.connect(new StdioClientTransport({ command, args: commandArgs, env: npxEnv, cwd: path.resolve("."), stderr: "pipe" }));
    try {
      expect((await overNpx.listTools()).tools).toHaveLength(6);
    } finally {
      await overNpx.close();
    }

    const http = JSON.parse(block("mcp-http").replaceAll(DEFAULT_URL, url).replaceAll("egm_your_writer_key", engram.tenant.writer)).mcpServers.engram;
    const overHttp = new Client({ name: "readme", version: "1.0.0" });
    await overHttp.connect(new StreamableHTTPClientTransport(new URL(http.url), { requestInit: { headers: http.headers } }));
    try {
      const facts = await overHttp.readResource({ uri: "engram://users/ana/facts" });
      expect((facts.contents[0] as { text: string }).text).toContain("Ana prefers morning deliveries.");
    } finally {
      await overHttp.close();
    }
  }, 180_000);

  it("runs the REST curl examples", async () => {
    const created = await engram.gql(
      `mutation { createEntry(input: { scope: ENTITY, scopeRef: "ent_acme", title: "ROAS review", summary: "Weekly ROAS check.", tags: ["decision"] }) { id } }`,
      {},
      engram.tenant.writer,
    );
    const ENTRY_ID = created.data.createEntry.id;
    const { stdout } = await promisify(execFile)("bash", ["-euo", "pipefail", "-c", block("rest").replaceAll(DEFAULT_URL, url)], {
      env: { ...process.env, ENGRAM_KEY: engram.tenant.writer, ENTRY_ID },
      timeout: 30_000,
    });
    expect(stdout).toContain('"title":"ROAS review"'); // search, then the read
    expect(stdout).toContain('"title":"ROAS floor is 3"'); // created
    expect(stdout).toContain('"importance":5'); // corrected
    expect(stdout).toContain(`{"change":"FORGOTTEN","entry":null,"entryId":"${ENTRY_ID}"`);
    expect(stdout).toContain('"sourceRef":"call-8812"');
    expect(stdout).not.toContain('"errors"');
    expect(await engram.services.db.memoryEntry.count({ where: { id: ENTRY_ID } })).toBe(0);
  });
});
