import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import {
  adminKeyOf,
  baseEnv,
  ensureCompiled,
  killAll,
  processTree,
  ROOT,
  runCli,
  startServer,
  tempDataDir,
  waitAllGone,
} from "./helpers/server-process.ts";
import { spawnSync } from "node:child_process";
import { createPostgresStore, serverUrl, type TestStore } from "./helpers/store.ts";

// Processes start slowly on a loaded machine: generous limits (behaviour, not speed, is tested).
vi.setConfig({ testTimeout: 300_000, hookTimeout: 300_000 });

// The CLI and the server's start as a user meets them: compiled, on a real data folder.

const KEY = /^egm_[\w-]+$/;
const dirs: string[] = [];
const folder = () => {
  const dir = tempDataDir("engram-cli-");
  dirs.push(dir);
  return dir;
};

beforeAll(() => ensureCompiled());
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

async function stopServer(server: Awaited<ReturnType<typeof startServer>>) {
  const pids = processTree(server.child.pid!);
  process.kill(server.child.pid!, "SIGTERM");
  await waitAllGone(pids, server.dataDir).catch(() => killAll(pids, server.dataDir));
}

describe("keys that cannot be lost", () => {
  it("recovers an admin key with the server stopped, and lists tenants with their keys", async () => {
    const dir = folder();
    const server = await startServer({ via: "node", dataDir: dir });
    await adminKeyOf(server);
    await stopServer(server);

    const listed = runCli(["tenants", "list"], { ENGRAM_DATA_DIR: dir });
    expect(listed.code, listed.stderr).toBe(0);
    const [id, name, keys] = listed.stdout.trim().split("\t");
    expect(name).toBe("default");
    expect(keys).toBe("1 keys");

    // Run from another folder (the default ./.engram is then another one): refused, and nothing is made
    // there; it made a new, empty store and said "no tenants yet".
    const elsewhere = path.join(dir, "elsewhere", ".engram");
    for (const args of [["tenants", "list"], ["keys", "create", "--role", "admin"]]) {
      const refused = runCli(args, { ENGRAM_DATA_DIR: elsewhere });
      expect(refused.code, args.join(" ")).toBe(1);
      expect(refused.stderr.trim()).toBe(
        `No Engram store in ${elsewhere} (ENGRAM_DATA_DIR; its default, ./.engram, is in the current folder): run this in the folder Engram runs in, or set ENGRAM_DATA_DIR.`,
      );
    }
    expect(existsSync(elsewhere)).toBe(false);

    const recovered = runCli(["keys", "create", "--role", "admin", "--tenant", id], { ENGRAM_DATA_DIR: dir });
    expect(recovered.code, recovered.stderr).toBe(0);
    expect(recovered.stdout.trim()).toMatch(KEY);
    const relisted = runCli(["tenants", "list"], { ENGRAM_DATA_DIR: dir });
    expect(relisted.stdout, `exit ${relisted.code}: ${relisted.stderr}`).toContain(`${id}\tdefault\t2 keys`);

    const unknown = runCli(["keys", "create", "--role", "admin", "--tenant", "00000000-0000-0000-0000-000000000000"], { ENGRAM_DATA_DIR: dir });
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/was not found/);
    // An empty --tenant (a script's unset variable) is refused, not read as "the only tenant".
    const empty = runCli(["keys", "create", "--role=admin", "--tenant="], { ENGRAM_DATA_DIR: dir });
    expect(empty.code).toBe(1);
    expect(empty.stderr).toMatch(/--tenant is empty/);
    expect(runCli(["tenants", "list"], { ENGRAM_DATA_DIR: dir }).stdout).toContain(`${id}\tdefault\t2 keys`);

    // The recovered key opens the API.
    const next = await startServer({ via: "node", dataDir: dir });
    try {
      const response = await fetch(`${next.url}/graphql`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${recovered.stdout.trim()}` },
        body: JSON.stringify({ query: "{ viewer { role } }" }),
      });
      expect((await response.json()).data.viewer.role).toBe("ADMIN");
      // Both admin keys are in the audit log, made by no key: the first start's, then the CLI's.
      const audit = await fetch(`${next.url}/graphql`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${recovered.stdout.trim()}` },
        body: JSON.stringify({ query: "{ auditLog { edges { node { action apiKeyId changes } } } }" }),
      });
      const rows = (await audit.json()).data.auditLog.edges.map((e: any) => e.node);
      expect(rows.map((r: any) => [r.action, r.apiKeyId, r.changes.target.role, r.changes.via])).toEqual([
        ["apiKey.create", null, "ADMIN", "cli"],
        ["apiKey.create", null, "ADMIN", "first start"],
      ]);
      expect(rows[0].changes.target.prefix).toBe(recovered.stdout.trim().slice(0, 10));
    } finally {
      await stopServer(next);
    }
  });

  it("a first start on a busy port creates no tenant, so the next start prints the key", async () => {
    const busy = net.createServer();
    const port = await new Promise<number>((resolve) => busy.listen(0, "127.0.0.1", () => resolve((busy.address() as net.AddressInfo).port)));
    const dir = folder();
    const failed = spawnSync(process.execPath, ["dist/main.js"], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 120_000,
      env: { ...process.env, ENGRAM_DATA_DIR: dir, PORT: String(port), HOST: "127.0.0.1", ENGRAM_LOG_LEVEL: "warn", DATABASE_URL: "" },
    });
    busy.close();
    expect(failed.status).toBe(1);
    expect(failed.stdout).not.toMatch(/ENGRAM_ADMIN_KEY/);
    expect(failed.stderr).toMatch(new RegExp(`Port ${port} on 127.0.0.1 is already in use`));
    expect(existsSync(path.join(dir, "engram.owner.json"))).toBe(false);

    const next = await startServer({ via: "node", dataDir: dir });
    try {
      expect(await adminKeyOf(next)).toMatch(KEY);
    } finally {
      await stopServer(next);
    }
  });
});

describe("a start that cannot open its store or its address", () => {
  const start = (env: Record<string, string>) =>
    spawnSync(process.execPath, ["dist/main.js"], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 120_000,
      env: { ...process.env, ENGRAM_DATA_DIR: folder(), PORT: "0", HOST: "127.0.0.1", ENGRAM_LOG_LEVEL: "warn", DATABASE_URL: "", REDIS_URL: "", ...env },
    });

  it("says in one line which setting to check, never with a stack", async () => {
    const closed = net.createServer();
    const port = await new Promise<number>((resolve) => closed.listen(0, "127.0.0.1", () => resolve((closed.address() as net.AddressInfo).port)));
    await new Promise((resolve) => closed.close(resolve));
    const noServer = start({ DATABASE_URL: `postgres://engram:hunter2@127.0.0.1:${port}/engram` });
    expect(noServer.status).toBe(1);
    expect(noServer.stderr).toMatch(new RegExp(`Cannot open the database DATABASE_URL names \\(postgres://engram:\\*\\*\\*@127.0.0.1:${port}/engram\\): .*ECONNREFUSED.*Check DATABASE_URL`));
    expect(noServer.stderr).not.toMatch(/hunter2|\n\s+at /);
    const noAddress = start({ HOST: "192.0.2.1" });
    expect(noAddress.status).toBe(1);
    expect(noAddress.stderr).toMatch(/Cannot listen on 192\.0\.2\.1:0 \(EADDRNOTAVAIL\): set HOST/);
    expect(noAddress.stderr).not.toMatch(/\n\s+at /);
  });
});

describe("one owner per folder", () => {
  it("a second npm start refuses in one line, without rebuilding the inspector", async () => {
    const dir = folder();
    const first = await startServer({ via: "node", dataDir: dir });
    const index = path.join(ROOT, "web", "dist", "index.html");
    const built = existsSync(index) ? statSync(index).mtimeMs : 0;
    try {
      const second = spawnSync("npm", ["start", "--silent"], {
        cwd: ROOT,
        encoding: "utf8",
        timeout: 120_000,
        env: { ...process.env, ENGRAM_DATA_DIR: dir, PORT: "0", ENGRAM_LOG_LEVEL: "warn", DATABASE_URL: "" },
      });
      expect(second.status).not.toBe(0);
      const lines = second.stderr.trim().split("\n").filter((line) => !line.startsWith("npm "));
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(/already opened by Engram \(pid \d+\)/);
      expect(existsSync(index) ? statSync(index).mtimeMs : 0).toBe(built);
      // The first one is untouched.
      expect((await fetch(`${first.url}/healthz`)).status).toBe(200);
    } finally {
      await stopServer(first);
    }
  });
});

describe("not built (npm ci --ignore-scripts)", () => {
  it("npm start and the CLI say how to build, in one line", () => {
    // A checkout whose install scripts did not run: package.json and bin/, no dist/.
    const dir = folder();
    writeFileSync(path.join(dir, "package.json"), readFileSync(path.join(ROOT, "package.json")));
    mkdirSync(path.join(dir, "bin"));
    writeFileSync(path.join(dir, "bin", "engram.mjs"), readFileSync(path.join(ROOT, "bin", "engram.mjs")));
    const npmStart = spawnSync("npm", ["start", "--silent"], { cwd: dir, encoding: "utf8", timeout: 60_000 });
    const cli = spawnSync(process.execPath, ["bin/engram.mjs", "tenants", "list"], { cwd: dir, encoding: "utf8", timeout: 60_000 });
    for (const run of [npmStart, cli]) {
      expect(run.status).toBe(1);
      expect(run.stderr.trim().split("\n").filter((line) => !line.startsWith("npm "))).toEqual([
        "Engram is not built: run `npm run postinstall` (npm ci runs it, unless --ignore-scripts).",
      ]);
    }
  });
});

describe("engram import", () => {
  it("says nothing was imported when nothing was", async () => {
    const dir = folder();
    const server = await startServer({ via: "node", dataDir: dir });
    try {
      await adminKeyOf(server);
      const empty = path.join(dir, "empty.jsonl");
      writeFileSync(empty, "\n");
      const none = runCli(["import", empty], { ENGRAM_DATA_DIR: dir });
      expect(none.code, none.stderr).toBe(0);
      expect(none.stdout).toMatch(/^nothing imported: the file has no conversations/);
      expect(none.stdout).not.toMatch(/queued/);

      const bad = path.join(dir, "bad.jsonl");
      writeFileSync(bad, '{"agentExternalId": "a"}\nnot json\n');
      const failed = runCli(["import", bad], { ENGRAM_DATA_DIR: dir });
      expect(failed.code).toBe(1);
      expect(failed.stdout).toMatch(/^nothing imported: all 2 conversations failed/);
      expect(failed.stderr).toMatch(/line 1: /);
    } finally {
      await stopServer(server);
    }
  });
});

describe("engram compact --now", () => {
  it("exits 1 when a tenant's compaction failed, so a cron line or script learns of it", async () => {
    const dir = folder();
    // A model that cannot be reached: the compaction of a due bucket fails, at once.
    const env = { OPENAI_BASE_URL: "http://127.0.0.1:9/v1", ENGRAM_MODEL_MAX_RETRIES: "0", ENGRAM_MODEL_TIMEOUT_MS: "2000" };
    const server = await startServer({ via: "node", dataDir: dir, env: { ...env, ENGRAM_JOBS: "off" } });
    try {
      const key = await adminKeyOf(server);
      for (const n of [1, 2, 3]) {
        const response = await fetch(`${server.url}/graphql`, {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
          body: JSON.stringify({
            query: `mutation($n: String!) { appendEvent(input: { scope: ENTITY, scopeRef: "acme", kind: "call_summary", body: $n, source: "crm", sourceRef: $n, occurredAt: "2020-01-0${n}T00:00:00Z" }) { id } }`,
            variables: { n: `call ${n}` },
          }),
        });
        expect((await response.json()).errors).toBeUndefined();
      }
      const run = runCli(["compact", "--now"], { ...env, ENGRAM_DATA_DIR: dir });
      // It printed the FAILED line and exited 0 before.
      expect(run.stdout, run.stderr).toMatch(/^\S+ FAILED /);
      expect(run.code).toBe(1);
      const retention = runCli(["retention", "--now"], { ...env, ENGRAM_DATA_DIR: dir });
      expect(retention.stdout).toMatch(/^\S+ SUCCEEDED /);
      expect(retention.code).toBe(0);
    } finally {
      await stopServer(server);
    }
  });
});

describe("the CLI", () => {
  it("prints its usage, with the recovery path", () => {
    const help = runCli(["--help"], {});
    expect(help.code).toBe(0);
    expect(help.stderr).toMatch(/tenants list/);
    expect(help.stderr).toMatch(/keys create --role <admin\|writer\|reader>/);
  });

  it("ends quietly when its reader stops early (a closed pipe), as a Unix tool does", () => {
    const dir = folder();
    // `| true` reads nothing and exits: the CLI's answer meets a closed pipe (EPIPE).
    const piped = spawnSync("bash", ["-c", 'set -o pipefail; "$0" bin/engram.mjs tenants create Acme | true', process.execPath], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 120_000,
      env: baseEnv({ ENGRAM_DATA_DIR: dir }),
    });
    expect(piped.status, piped.stderr).toBe(0);
    expect(piped.stderr).not.toMatch(/EPIPE|at .*\(/);
  });

  // `tenants create --help` made a tenant named "--help" and printed its admin key; an unknown
  // option printed Node's ERR_PARSE_ARGS stack and exited 1; `export-user --help` opened the store.
  it("answers --help per command without acting, and refuses bad arguments in one line with exit code 2", () => {
    const dir = folder();
    const tenantCount = () => runCli(["tenants", "list"], { ENGRAM_DATA_DIR: dir }).stdout.trim().split("\n").filter(Boolean).length;
    expect(runCli(["tenants", "create", "Acme"], { ENGRAM_DATA_DIR: dir }).code).toBe(0);
    expect(tenantCount()).toBe(1);

    const help = runCli(["tenants", "create", "--help"], { ENGRAM_DATA_DIR: dir });
    expect(help.code).toBe(0);
    expect(help.stdout).toBe("");
    expect(help.stderr).toMatch(/^Usage: engram tenants create <name>/);
    for (const args of [["--", "--help"], ["-h"], ["Acme", "--bogus"]]) {
      const refused = runCli(["tenants", "create", ...args], { ENGRAM_DATA_DIR: dir });
      expect(refused.code, args.join(" ")).toBe(args[0] === "-h" ? 0 : 2);
      expect(refused.stdout, args.join(" ")).toBe("");
    }
    expect(tenantCount()).toBe(1);

    const unknown = runCli(["keys", "create", "--role", "admin", "--bogus"], { ENGRAM_DATA_DIR: dir });
    expect(unknown.code).toBe(2);
    expect(unknown.stdout).toBe("");
    const [line, ...usage] = unknown.stderr.trim().split("\n");
    expect(line).toBe("engram keys create: Unknown option '--bogus'");
    expect(usage[0]).toMatch(/^Usage: engram keys create --role/);
    expect(unknown.stderr).not.toMatch(/ERR_PARSE_ARGS|\n\s+at /);
    for (const args of [["keys", "create", "--role"], ["keys", "create", "--role", "owner"], ["compact"], ["export-user"], ["import", "a.jsonl", "b.jsonl"]]) {
      const refused = runCli(args, { ENGRAM_DATA_DIR: dir });
      expect(refused.code, args.join(" ")).toBe(2);
      expect(refused.stderr, args.join(" ")).toMatch(new RegExp(`^engram ${args[0]}.*\nUsage: engram ${args[0]}`));
    }

    // A command that does not exist is named, before the usage (it printed the usage alone).
    for (const [args, named] of [[["bogus"], "bogus"], [["tenants", "delete", "x"], "tenants delete"], [["--version"], "--version"]] as const) {
      const refused = runCli([...args], { ENGRAM_DATA_DIR: dir });
      expect(refused.code, args.join(" ")).toBe(2);
      expect(refused.stderr.split("\n").slice(0, 2)).toEqual([`engram: '${named}' is not a command`, "Usage: engram <command>"]);
    }

    // Help opens nothing: the data folder it would use is never made.
    const untouched = path.join(dir, "never-opened");
    for (const command of [["export-user", "--help"], ["import", "--help"], ["compact", "--help"], ["keys", "create", "--help"]]) {
      const asked = runCli(command, { ENGRAM_DATA_DIR: untouched });
      expect(asked.code, command.join(" ")).toBe(0);
      expect(asked.stderr, command.join(" ")).toMatch(new RegExp(`^Usage: engram ${command.join(" ").replace(" --help", "")}`));
    }
    expect(existsSync(untouched)).toBe(false);
  });
});

describe.skipIf(!serverUrl)("on PostgreSQL without CHROMA_URL", () => {
  it("says where the embedded Chroma keeps its data", async () => {
    const db = (await createPostgresStore(serverUrl!, { label: "cli" })) as TestStore;
    const dir = folder();
    try {
      const server = await startServer({ via: "node", dataDir: dir, env: { DATABASE_URL: db.vars.DATABASE_URL } });
      await stopServer(server);
      expect(server.output()).toContain(`no CHROMA_URL: this instance keeps recall vectors in its own embedded Chroma under ${dir}/chroma`);
      expect(existsSync(path.join(dir, "engram.owner.json"))).toBe(false); // the folder holds no store
      expect(existsSync(path.join(dir, "pg"))).toBe(false);
    } finally {
      await db.drop();
    }
  });
});
