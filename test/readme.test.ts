import { spawn, spawnSync } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { createPostgresStore, redisUrl, serverUrl } from "./helpers/store.ts";
import {
  adminKeyOf,
  closeWatch,
  ensureCompiled,
  killAll,
  processTree,
  ROOT,
  startServer,
  waitAllGone,
  type ServerProcess,
} from "./helpers/server-process.ts";
import { until } from "./helpers/until.ts";

// Processes start slowly on a loaded machine: generous limits (behaviour, not speed, is tested).
vi.setConfig({ testTimeout: 300_000, hookTimeout: 300_000 });

// The README's examples, run as written against a real Engram (the compiled server on a free
// port; the CLI through an `npx` that runs bin/engram.mjs). A block is run when the line before
// its fence is `<!-- readme-test: <id> -->` and RUNNERS has that id. To add one: mark the block,
// add its runner here (or run it from another test file that names it, as readme-agent.test.ts
// does). A marked block that no test names, or a runner without its block, fails.

type Block = { id: string; lang: string; code: string; line: number };

function readmeBlocks(): Block[] {
  const lines = readFileSync(path.join(ROOT, "README.md"), "utf8").split("\n");
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const marker = /^<!-- readme-test: ([\w-]+) -->$/.exec(lines[i].trim());
    if (!marker) continue;
    const fence = /^```(\w*)/.exec(lines[i + 1] ?? "");
    if (!fence) throw new Error(`README line ${i + 1}: a readme-test marker must sit right above a code fence`);
    const end = lines.findIndex((line, j) => j > i + 1 && line.startsWith("```"));
    blocks.push({ id: marker[1], lang: fence[1], code: lines.slice(i + 2, end).join("\n"), line: i + 2 });
    i = end;
  }
  return blocks;
}

const blocks = readmeBlocks();
const block = (id: string) => blocks.find((b) => b.id === id)!;

let server: ServerProcess;
let key: string;
let work: string;
let shim: string;
const state: { conversationId?: string; tenantId?: string } = {};

const host = () => new URL(server.url).host;
/** The README's examples talk to 127.0.0.1:4000; here the server is on a free port. */
const local = (code: string) => code.replaceAll("127.0.0.1:4000", host());

async function gql(query: string, variables?: Record<string, unknown>, bearer = key) {
  const response = await fetch(`${server.url}/graphql`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${bearer}` },
    body: JSON.stringify({ query, variables }),
  });
  return (await response.json()) as { data?: any; errors?: { message: string }[] };
}

/** Runs shell text as a user would, with `npx engram` going to this checkout's compiled CLI. */
function sh(code: string, env: Record<string, string> = {}) {
  const result = spawnSync("bash", ["-euo", "pipefail", "-c", local(code)], {
    cwd: work,
    encoding: "utf8",
    timeout: 180_000,
    env: {
      ...process.env,
      PATH: `${shim}:${process.env.PATH}`,
      ENGRAM_DATA_DIR: server.dataDir,
      ENGRAM_KEY: key,
      ENGRAM_LOG_LEVEL: "warn",
      DATABASE_URL: "",
      ...env,
    },
  });
  return { code: result.status, stdout: result.stdout, stderr: result.stderr };
}

/** The block's lines that are commands (comments and blank lines dropped). */
const commands = (code: string) => code.split("\n").filter((line) => line.trim() && !line.trim().startsWith("#"));
const KEY = /^egm_[\w-]+$/;

/** Splits a GraphQL block into its top-level operations (comments before the first are dropped). */
const operations = (code: string) =>
  code
    .split(/\n(?=(?:query|mutation|subscription)\b)/)
    .map((op) => op.trim())
    .filter((op) => /^(query|mutation|subscription)\b/.test(op));

const RUNNERS: Record<string, (b: Block) => Promise<void>> = {
  async quickstart(b) {
    expect(commands(b.code).map((line) => line.split("#")[0].trim())).toEqual(["npm ci && npm start", "npm ci && npm test"]);
    const pkg = JSON.parse(readFileSync(path.join(ROOT, "package.json"), "utf8"));
    expect(pkg.scripts.start).toMatch(/; MALLOC_ARENA_MAX=\$\{MALLOC_ARENA_MAX:-2\} exec node --heap-growing-percent=50 --max-semi-space-size=4 dist\/main.js$/);
    expect(pkg.scripts.postinstall).toMatch(/generate.*build/);
    // `npm start` itself is run by test/signals.test.ts; here the compiled server answers.
    expect((await fetch(`${server.url}/healthz`)).status).toBe(200);
  },

  async "admin-key-line"(b) {
    // The first start printed it as shown, on a line of its own, and it is the key that works.
    const shown = new RegExp(`^${b.code.trim().replace("…", "[\\w-]+")}$`, "m");
    expect(server.output()).toMatch(shown);
    expect(shown.exec(server.output())![0]).toBe(`ENGRAM_ADMIN_KEY=${key}`);
  },

  async "keys-cli"(b) {
    const [create, list, reader, admin] = commands(b.code);
    const created = sh(create);
    expect(created.code, created.stderr).toBe(0);
    expect(created.stdout.trim()).toMatch(KEY);
    const tenantId = /tenant ([0-9a-f-]{36}) \(Acme\)/.exec(created.stderr)?.[1];
    expect(tenantId, created.stderr).toBeDefined();
    state.tenantId = tenantId;

    const listed = sh(list);
    expect(listed.code, listed.stderr).toBe(0);
    expect(listed.stdout).toContain(`${tenantId}\tAcme\t1 keys`);

    for (const line of [reader, admin]) {
      const made = sh(line.replaceAll("<id>", tenantId!));
      expect(made.code, made.stderr).toBe(0);
      expect(made.stdout.trim()).toMatch(KEY);
    }
    const adminKey = sh(admin.replaceAll("<id>", tenantId!)).stdout.trim();
    const viewer = await gql("{ viewer { role tenant { id name } } }", undefined, adminKey);
    expect(viewer.data.viewer).toEqual({ role: "ADMIN", tenant: { id: tenantId, name: "Acme" } });
  },

  async "append-event"(b) {
    const run = sh(b.code);
    expect(run.code, run.stderr).toBe(0);
    const body = JSON.parse(run.stdout);
    expect(body.errors).toBeUndefined();
    expect(body.data.appendEvent.id).toBeTruthy();
  },

  async entries(b) {
    // The subscription in this block is the one the graphql-ws block runs over WebSocket.
    for (const op of operations(b.code).filter((op) => !op.startsWith("subscription"))) {
      const result = await gql(op);
      expect(result.errors, op).toBeUndefined();
    }
    const found = await gql(operations(b.code).find((op) => op.startsWith("query"))!);
    expect(found.data.entries.edges[0].node.title).toBe("Acme prefers ROAS over CPA");
  },

  async "graphql-ws"(b) {
    const file = path.join(ROOT, "test", "artifacts", `readme-ws-${process.pid}.mjs`);
    mkdirSync(path.dirname(file), { recursive: true });
    writeFileSync(file, b.code.replaceAll("ws://127.0.0.1:4000", `ws://${host()}`));
    try {
      const child = spawn(process.execPath, [file], { env: { ...process.env, ENGRAM_KEY: key }, stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      child.stdout.on("data", (chunk) => (out += chunk));
      child.stderr.on("data", (chunk) => (out += chunk));
      // 'close', not 'exit': only then has every byte it printed been read into `out`.
      const exited = new Promise<number | null>((resolve) => child.once("close", resolve));
      let done = false;
      void exited.then(() => (done = true));
      // Append until the subscriber has seen one (it may subscribe after the first append).
      for (let i = 0; !done && i < 60; i++) {
        await gql(`mutation($i: AppendEventInput!) { appendEvent(input: $i) { id } }`, {
          i: { scope: "ENTITY", scopeRef: "acme", kind: "ws_check", body: `check ${i}`, source: "readme-test", sourceRef: `ws-${i}` },
        });
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
      if (!done) child.kill("SIGKILL");
      expect(await exited, out).toBe(0);
      expect(out).toMatch(/kind: 'ws_check'/);
    } finally {
      rmSync(file, { force: true });
    }
  },

  async "record-turn"(b) {
    const result = await gql(b.code);
    expect(result.errors).toBeUndefined();
    state.conversationId = result.data.recordTurn.conversation.id;
    expect(state.conversationId).toBeTruthy();
  },

  async context(b) {
    const result = await gql(b.code, { conversationId: state.conversationId });
    expect(result.errors).toBeUndefined();
    expect(result.data.context.blocks.map((x: { kind: string }) => x.kind)).toContain("TAIL");
    expect(result.data.context.blocks.find((x: { kind: string }) => x.kind === "TAIL").text).toContain("Hôtel du Nord");
  },

  async "recall-debug"(b) {
    const [recall, status, subscription] = operations(b.code);
    // The record-turn example's turn, once searchable (what the status query is for).
    await until("guest-42's turns to be searchable", async () => {
      const answer = await gql(status);
      expect(answer.errors, JSON.stringify(answer)).toBeUndefined();
      return answer.data.recallIndexStatus.pending === 0;
    }, 60_000);
    const found = await gql(recall);
    expect(found.errors).toBeUndefined();
    expect(found.data.recall.candidates[0].text).toContain("Hôtel du Nord");
    // The subscription over SSE (the graphql-ws example runs one over WebSocket): it opens, and
    // says nothing (no error) until a recall happens.
    const stop = new AbortController();
    const response = await fetch(`${server.url}/graphql`, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "text/event-stream", authorization: `Bearer ${key}` },
      body: JSON.stringify({ query: subscription }),
      signal: stop.signal,
    });
    expect(response.status).toBe(200);
    const reader = response.body!.getReader();
    const first = await Promise.race([reader.read(), new Promise((resolve) => setTimeout(resolve, 1_000, null))]);
    stop.abort();
    expect(first === null || !new TextDecoder().decode((first as { value?: Uint8Array }).value).includes("errors")).toBe(true);
  },

  async "compact-now"(b) {
    const run = sh(b.code);
    expect(run.code, run.stderr).toBe(0);
    // A line per tenant: its run's status, and why when it was skipped (no model configured here).
    const lines = run.stdout.trim().split("\n");
    expect(lines.length).toBeGreaterThan(0);
    for (const line of lines) expect(line).toMatch(/^[0-9a-f-]{36} (SUCCEEDED \{.*\}|SKIPPED \{"reason":"compaction is off: no model configured"\})$/);
  },

  async "tenant-settings"(b) {
    const result = await gql(b.code);
    expect(result.errors).toBeUndefined();
    expect(result.data.updateTenantSettings.modelRouting.compaction).toEqual({ effectiveModel: "qwen2.5-32b", hasApiKey: true });
  },

  async "forget-user"(b) {
    const externalId = /endUserExternalId: "([^"]+)"/.exec(b.code)![1];
    const turn = await gql(
      `mutation($u: String!) { recordTurn(input: {agentExternalId: "concierge", endUserExternalId: $u, conversationExternalId: "forget-me", clientTurnId: "forget-me-1", userMessage: "My passport number is on file.", assistantMessage: "Noted."}) { id } }`,
      { u: externalId },
    );
    expect(turn.errors).toBeUndefined();
    const result = await gql(b.code);
    expect(result.errors).toBeUndefined();
    expect(result.data.forgetUser).toMatchObject({ messages: 2 });
    const again = await gql(`{ facts(endUserExternalId: "${externalId}") { id } }`);
    expect(again).toEqual({ data: { facts: [] } });
  },

  async "recall-cli"(b) {
    writeFileSync(path.join(work, "conversations.jsonl"), `${block("import-line").code}\n`);
    const [importLine, retention] = commands(b.code);
    // Several tenants exist by now (the keys example made one): the import names the first.
    const imported = sh(`${importLine.split(" #")[0]} --tenant ${await firstTenant()}`);
    expect(imported.code, imported.stderr).toBe(0);
    expect(imported.stdout).toMatch(/^imported 1 of 1 conversations \(2 messages\); .* queued/);
    const retained = sh(retention);
    expect(retained.code, retained.stderr).toBe(0);
    expect(retained.stdout).toMatch(/ (done|ok|succeeded|DONE|SUCCEEDED)/i);
  },

  async "import-line"(b) {
    // Its dates must survive the default 180-day retention the night after an import.
    for (const line of commands(b.code)) {
      for (const message of JSON.parse(line).messages) {
        const age = Date.now() - Date.parse(message.occurredAt);
        expect(age, `${message.occurredAt} is in the future`).toBeGreaterThan(0);
        expect(age / 86_400_000, `${message.occurredAt} is older than 180 days: retention would delete it`).toBeLessThan(150);
      }
    }
  },

  async "production-start"(b) {
    if (!serverUrl || !redisUrl) {
      console.warn("readme: production-start needs ENGRAM_TEST_DATABASE_URL and ENGRAM_TEST_REDIS_URL; not run");
      return;
    }
    const db = await createPostgresStore(serverUrl, { label: "readme" });
    const dataDir = mkdtempSync(path.join(tmpdir(), "engram-readme-prod-"));
    const line = commands(b.code)[0]
      .replace(/DATABASE_URL=\S+/, `DATABASE_URL=${db.vars.DATABASE_URL}`)
      .replace(/REDIS_URL=\S+/, `REDIS_URL=${redisUrl}`)
      .replace("HOST=0.0.0.0", "HOST=127.0.0.1 PORT=0");
    const child = spawn("bash", ["-c", line], {
      cwd: ROOT,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, ENGRAM_DATA_DIR: dataDir, CHROMA_URL: "", ENGRAM_LOG_LEVEL: "info" },
    });
    const drained = closeWatch(child);
    let out = "";
    child.stdout!.on("data", (chunk) => (out += chunk));
    child.stderr!.on("data", (chunk) => (out += chunk));
    try {
      await until("the production start to listen", async () => /listening on/.test(out), 90_000);
      const pids = processTree(child.pid!);
      process.kill(-child.pid!, "SIGTERM");
      await waitAllGone(pids, dataDir);
      await drained();
      expect(out).toMatch(/store closed; bye/);
    } finally {
      killAll(processTree(child.pid!), dataDir);
      await db.drop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  },
};

async function firstTenant(): Promise<string> {
  const listed = sh("npx engram tenants list");
  return listed.stdout.split("\n")[0].split("\t")[0];
}

beforeAll(async () => {
  ensureCompiled();
  work = mkdtempSync(path.join(tmpdir(), "engram-readme-"));
  shim = path.join(work, ".bin");
  mkdirSync(shim);
  writeFileSync(
    path.join(shim, "npx"),
    `#!/usr/bin/env bash\nif [[ $1 == engram ]]; then shift; exec "${process.execPath}" "${ROOT}/bin/engram.mjs" "$@"; fi\necho "readme test: only npx engram is available here" >&2; exit 127\n`,
  );
  chmodSync(path.join(shim, "npx"), 0o755);
  // As an operator who lets tenants bring their model keys runs it (the tenant-settings example).
  server = await startServer({ via: "node", env: { ENGRAM_SECRET: "readme-example-secret-0123456789" } });
  key = await adminKeyOf(server);
}, 300_000);

afterAll(async () => {
  if (server) {
    const pids = processTree(server.child.pid!);
    process.kill(server.child.pid!, "SIGTERM");
    await waitAllGone(pids, server.dataDir).catch(() => killAll(pids, server.dataDir));
    rmSync(server.dataDir, { recursive: true, force: true });
  }
  if (work) rmSync(work, { recursive: true, force: true });
});

describe("README", () => {
  it("every marked block has a runner (here or in another test file), and every runner its block", () => {
    const others = readdirSync(path.join(ROOT, "test"))
      .filter((file) => file.endsWith(".test.ts") && file !== "readme.test.ts")
      .map((file) => readFileSync(path.join(ROOT, "test", file), "utf8"))
      .join("\n");
    const unrun = blocks.filter((b) => !RUNNERS[b.id] && !others.includes(`"${b.id}"`)).map((b) => `${b.id} (line ${b.line})`);
    expect(unrun).toEqual([]);
    expect(Object.keys(RUNNERS).filter((id) => !blocks.some((b) => b.id === id))).toEqual([]);
    // Every example is run: a code fence without a marker above it is one nobody runs.
    const lines = readFileSync(path.join(ROOT, "README.md"), "utf8").split("\n");
    const unmarked: number[] = [];
    for (let i = 0, open = false; i < lines.length; i++) {
      if (!lines[i].startsWith("```")) continue;
      if (!open && !/^<!-- readme-test: [\w-]+ -->$/.test(lines[i - 1]?.trim() ?? "")) unmarked.push(i + 1);
      open = !open;
    }
    expect(unmarked, "README lines of code blocks without a readme-test marker").toEqual([]);
  });

  for (const b of blocks.filter((b) => RUNNERS[b.id])) {
    it(`runs the "${b.id}" example (README line ${b.line})`, async () => {
      try {
        await RUNNERS[b.id]!(b);
      } catch (error) {
        // The server's own log says why it stopped answering, when it did.
        console.error(`the server's log (README line ${b.line}):\n${server.output().slice(-6000)}`);
        throw error;
      }
    }, 300_000);
  }
});
