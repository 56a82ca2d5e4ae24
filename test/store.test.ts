import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it, vi } from "vitest";
import { buildApp } from "../src/app.ts";
import { bootstrapFirstTenant } from "../src/auth.ts";
import { EnvError, ignoredNames, readEnv } from "../src/env.ts";
import { createLogger, sparingly } from "../src/log.ts";
import { summarizeJob } from "../src/queue.ts";
import { openServices } from "../src/services.ts";
import {
  attachOrStartEmbeddedStore,
  externalStore,
  readOwner,
  startEmbeddedStore,
  StoreBusyError,
  StoreSecretError,
  type Store,
} from "../src/embedded/embedded.ts";
import { committedMigrations, migrate } from "../src/embedded/migrate.ts";
import { processStarted, readOwnerFile } from "../src/embedded/owner.ts";
import { ROOT } from "../src/paths.ts";
import { createTestStore, type TestStore } from "./helpers/store.ts";

const KEY = /^egm_[A-Za-z0-9_-]+$/;

const cleanups: (() => Promise<unknown> | unknown)[] = [];
const children = new Set<ChildProcess>();

afterAll(async () => {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  for (const cleanup of cleanups.reverse()) await Promise.resolve(cleanup()).catch(() => {});
});

function tempDir() {
  const dir = mkdtempSync(path.join(tmpdir(), "engram-store-test-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function testStore(): Promise<TestStore> {
  const store = await createTestStore();
  cleanups.push(() => store.drop());
  return store;
}

/** The running store behind a test store: the embedded one is started (and owned) here. */
async function openStore(store: TestStore): Promise<Store> {
  const running = store.vars.DATABASE_URL
    ? externalStore(store.vars.DATABASE_URL)
    : await startEmbeddedStore(store.vars.ENGRAM_DATA_DIR);
  cleanups.push(() => running.stop());
  return running;
}

async function sql<T extends pg.QueryResultRow>(url: string, text: string): Promise<T[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<T>(text)).rows;
  } finally {
    await client.end();
  }
}

/** Only what the child needs: no DATABASE_URL, REDIS_URL or OPENAI_* leaks in from the host. */
function childEnv(vars: Record<string, string>) {
  const env: Record<string, string> = { ENGRAM_LOG_LEVEL: "warn", ...vars };
  for (const name of ["PATH", "HOME", "TMPDIR", "SYSTEMROOT"]) {
    if (process.env[name]) env[name] = process.env[name]!;
  }
  return env;
}

/** Runs a CLI command to its end; stdout and stderr are kept apart. */
function cli(args: string[], vars: Record<string, string>) {
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
    const child = spawn(process.execPath, ["bin/engram.mjs", ...args], {
      cwd: ROOT,
      env: childEnv(vars),
      stdio: ["ignore", "pipe", "pipe"],
    });
    children.add(child);
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout, stderr }));
  });
}

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function viewer(url: string, key: string) {
  const response = await fetch(`${url}/graphql`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ query: "{ viewer { role tenant { id name } } }" }),
  });
  return (await response.json()) as { data?: { viewer: { role: string; tenant: { id: string; name: string } } }; errors?: unknown[] };
}

/** Starts `bin/server.ts` as a user would, and resolves once it listens. */
async function startServer(vars: Record<string, string>) {
  const port = await freePort();
  const child = spawn(process.execPath, ["--import", "tsx", "bin/server.ts"], {
    cwd: ROOT,
    env: childEnv({ ...vars, HOST: "127.0.0.1", PORT: String(port), ENGRAM_JOBS: "off", ENGRAM_LOG_LEVEL: "info" }),
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.add(child);
  const output = { stdout: "", stderr: "" };
  child.stdout!.on("data", (d) => (output.stdout += d));
  child.stderr!.on("data", (d) => (output.stderr += d));
  const deadline = Date.now() + 90_000;
  while (!/Engram is listening/.test(output.stderr)) {
    if (child.exitCode !== null) throw new Error(`the server exited (${child.exitCode}):\n${output.stderr}`);
    if (Date.now() > deadline) throw new Error(`the server did not start in time:\n${output.stderr}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return {
    url: `http://127.0.0.1:${port}`,
    child,
    output,
    /** SIGTERM, as a supervisor would: resolves with the exit code once it is down. */
    stop: () =>
      new Promise<number | null>((resolve) => {
        if (child.exitCode !== null) return resolve(child.exitCode);
        child.once("exit", (code) => resolve(code));
        child.kill("SIGTERM");
      }),
  };
}

describe("migrations", { timeout: 120_000 }, () => {
  it("apply once: a second start on the same store applies nothing", async () => {
    const store = await openStore(await testStore());
    const all = committedMigrations().map((m) => m.name);
    expect(all.length).toBeGreaterThan(0);
    expect(await migrate(store.url)).toEqual(all);
    expect(await migrate(store.url)).toEqual([]);
    const recorded = await sql<{ name: string }>(store.url, `SELECT name FROM "_engram_migrations" ORDER BY name`);
    expect(recorded.map((r) => r.name)).toEqual(all);
  });

  it("fill in the message seqs of snippets made before they were stored (0013)", async () => {
    const store = await openStore(await testStore());
    const all = committedMigrations();
    const at = all.findIndex((m) => m.name === "0013_recall_snippet_message_seqs");
    await migrate(store.url, all.slice(0, at));
    await sql(
      store.url,
      `INSERT INTO "Tenant" ("id", "name") VALUES ('t', 'T');
       INSERT INTO "EndUser" ("id", "tenantId", "externalId", "updatedAt") VALUES ('u', 't', 'u', now());
       INSERT INTO "Agent" ("id", "tenantId", "externalId", "name", "updatedAt") VALUES ('a', 't', 'a', 'A', now());
       INSERT INTO "Conversation" ("id", "tenantId", "agentId", "endUserId", "externalId", "updatedAt") VALUES ('c', 't', 'a', 'u', 'c', now());
       INSERT INTO "Message" ("id", "tenantId", "conversationId", "seq", "role", "content", "occurredAt")
         VALUES ('m7', 't', 'c', 7, 'USER', 'hi', now()), ('m8', 't', 'c', 8, 'ASSISTANT', 'hello', now());
       INSERT INTO "RecallSnippet" ("id", "tenantId", "endUserId", "conversationId", "kind", "text", "messageIds", "occurredAt")
         VALUES ('turn', 't', 'u', 'c', 'TURN', 'user: hi', '{m8,gone,m7}', now()),
                ('summary', 't', 'u', 'c', 'SUMMARY', 'They met.', '{}', now());`,
    );
    expect(await migrate(store.url)).toEqual(all.slice(at).map((m) => m.name));
    const rows = await sql<{ id: string; messageSeqs: number[] }>(store.url, `SELECT "id", "messageSeqs" FROM "RecallSnippet" ORDER BY "id"`);
    // In messageIds' order, and 0 for a message deleted since, as recall reported it before.
    expect(rows).toEqual([
      { id: "summary", messageSeqs: [] },
      { id: "turn", messageSeqs: [8, 0, 7] },
    ]);
  });

  it("refuse a migration that was changed after it was applied", async () => {
    const store = await openStore(await testStore());
    await migrate(store.url);
    const changed = committedMigrations().map((m, i) => (i === 0 ? { ...m, checksum: `${m.checksum}-edited` } : m));
    await expect(migrate(store.url, changed)).rejects.toThrow(/was changed after it was applied/);
  });

  it("apply a new migration once, and roll back a failing one entirely", async () => {
    const store = await openStore(await testStore());
    await migrate(store.url);
    const extra = { name: "9000_test_extra", sql: `CREATE TABLE "TestExtra" (id int);`, checksum: "extra-1" };
    expect(await migrate(store.url, [...committedMigrations(), extra])).toEqual(["9000_test_extra"]);
    expect(await migrate(store.url, [...committedMigrations(), extra])).toEqual([]);

    const broken = { name: "9001_test_broken", sql: `CREATE TABLE "TestHalf" (id int); SELECT no_such_column FROM "TestExtra";`, checksum: "broken-1" };
    await expect(migrate(store.url, [...committedMigrations(), extra, broken])).rejects.toThrow(/Migration 9001_test_broken failed/);
    const tables = await sql<{ n: string }>(store.url, `SELECT count(*)::text AS n FROM information_schema.tables WHERE table_name = 'TestHalf'`);
    expect(tables[0].n).toBe("0");
    const recorded = await sql<{ name: string }>(store.url, `SELECT name FROM "_engram_migrations" WHERE name LIKE '9%' ORDER BY name`);
    expect(recorded.map((r) => r.name)).toEqual(["9000_test_extra"]);
  });
});

describe("the first start", { timeout: 120_000 }, () => {
  it("makes one first tenant and one admin key when instances start together on a new store", async () => {
    const store = await testStore();
    const services = await openServices(readEnv({ ENGRAM_LOG_LEVEL: "error", ENGRAM_JOBS: "off", ...store.vars }), { log: createLogger("error") });
    cleanups.push(() => services.close());
    const firsts = await Promise.all(Array.from({ length: 4 }, () => bootstrapFirstTenant(services.db)));
    expect(firsts.filter((first) => first !== null)).toHaveLength(1);
    expect(await services.db.tenant.count()).toBe(1);
    expect(await services.db.apiKey.count()).toBe(1);
  });
});

describe("configuration", () => {
  it("lists every problem of a bad PORT, DATABASE_URL and REDIS_URL at once", () => {
    let error: unknown;
    try {
      readEnv({ PORT: "99999", DATABASE_URL: "mysql://db/engram", REDIS_URL: "http://cache:6379" });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(EnvError);
    const { problems, message } = error as EnvError;
    expect(problems).toHaveLength(3);
    expect(problems.find((p) => p.startsWith("PORT:"))).toBeDefined();
    expect(problems.find((p) => p.startsWith("DATABASE_URL:"))).toMatch(/postgres:\/\//);
    expect(problems.find((p) => p.startsWith("REDIS_URL:"))).toMatch(/redis:\/\//);
    for (const problem of problems) expect(message).toContain(problem);
  });

  it("rejects a PORT that is not a number, and treats empty values as unset", () => {
    expect(() => readEnv({ PORT: "four thousand" })).toThrow(EnvError);
    const env = readEnv({ PORT: "", DATABASE_URL: "", REDIS_URL: "" });
    expect(env.PORT).toBe(4000);
    expect(env.DATABASE_URL).toBeUndefined();
    expect(env.REDIS_URL).toBeUndefined();
    expect(readEnv({ PORT: "0", DATABASE_URL: "postgresql://u@h/db", REDIS_URL: "rediss://h:6380" })).toMatchObject({
      PORT: 0,
      DATABASE_URL: "postgresql://u@h/db",
      REDIS_URL: "rediss://h:6380",
    });
  });
});

describe("settings that name a place", () => {
  it("refuses a URL Engram could not fetch and a list entry that could never match, naming each", () => {
    const problems = (vars: Record<string, string>) => {
      try {
        readEnv(vars);
        return [];
      } catch (error) {
        return (error as EnvError).problems;
      }
    };
    // `localhost:8000` parsed as a URL of scheme "localhost:": Chroma was then unreachable with no word at start.
    expect(problems({ CHROMA_URL: "localhost:8000" })).toEqual(["CHROMA_URL: must be an http:// or https:// URL"]);
    expect(problems({ OPENAI_BASE_URL: "ollama:11434" })).toEqual(["OPENAI_BASE_URL: must be an http:// or https:// URL"]);
    expect(problems({ ENGRAM_CORS_ORIGINS: "app.example.com, https://ok.example.com, https://a.example.com/app" })).toEqual([
      "ENGRAM_CORS_ORIGINS: 'app.example.com', 'https://a.example.com/app': each entry must be an origin: scheme, host and port only (e.g. https://app.example.com)",
    ]);
    expect(problems({ ENGRAM_MODEL_HOST_ALLOWLIST: "http://127.0.0.1:11434/v1, ollama.internal" })).toEqual([
      "ENGRAM_MODEL_HOST_ALLOWLIST: 'http://127.0.0.1:11434/v1': each entry must be a host or host:port, without a scheme or path (e.g. 127.0.0.1:11434)",
    ]);
    expect(
      readEnv({
        CHROMA_URL: "http://chroma:8000",
        OPENAI_BASE_URL: "http://127.0.0.1:11434/v1",
        ENGRAM_CORS_ORIGINS: "https://app.example.com/, http://localhost:5173",
        ENGRAM_MODEL_HOST_ALLOWLIST: "127.0.0.1:11434,[::1]:8080, ollama.internal",
      }).CHROMA_URL,
    ).toBe("http://chroma:8000");
  });
});

describe("a failure that repeats while the store is away", () => {
  it("is logged at most once per interval, the next line counting those left unsaid", () => {
    vi.useFakeTimers({ now: 0 });
    try {
      const said: [string, object | undefined][] = [];
      const log = { debug() {}, info() {}, warn: (message: string, fields?: object) => void said.push([message, fields]), error() {} };
      const lost = sparingly(log, "warn", "job notifications: connection lost; reconnecting", 30_000);
      for (let i = 0; i < 100; i++) {
        lost({ attempt: i });
        vi.advanceTimersByTime(100);
      }
      vi.advanceTimersByTime(30_000);
      lost({ attempt: 100 });
      expect(said).toEqual([
        ["job notifications: connection lost; reconnecting", { attempt: 0 }],
        ["job notifications: connection lost; reconnecting", { attempt: 100, sinceLast: 99 }],
      ]);
    } finally {
      vi.useRealTimers();
    }
  });
});

describe("configuration bounds and names", () => {
  it("refuses a duration Node's timers cannot wait, naming the variable", () => {
    // Over 2^31-1 ms Node fires a timer after 1 ms: every model call timed out at once.
    // ENGRAM_KEY_CACHE_TTL_MS has its own cap of 1 s.
    for (const name of ["ENGRAM_MODEL_TIMEOUT_MS", "ENGRAM_KEY_CACHE_TTL_MS", "ENGRAM_VECTOR_CACHE_TTL_MS", "ENGRAM_VECTOR_SEARCH_TIMEOUT_MS", "ENGRAM_JOB_POLL_MS", "ENGRAM_JOB_LOCK_MS"]) {
      let error: unknown;
      try {
        readEnv({ [name]: "3000000000" });
      } catch (e) {
        error = e;
      }
      expect(error, name).toBeInstanceOf(EnvError);
      expect((error as EnvError).problems, name).toEqual([expect.stringMatching(new RegExp(`^${name}: .*(at most|<=)`))]);
    }
    expect(readEnv({ ENGRAM_MODEL_TIMEOUT_MS: "2147483647" }).ENGRAM_MODEL_TIMEOUT_MS).toBe(2_147_483_647);
  });

  it("stops on a misspelt ENGRAM_ name with the setting it is closest to, among the other problems", () => {
    let error: unknown;
    try {
      readEnv({ ENGRAM_DATADIR: "/srv/engram", ENGRAM_JOB_POL_MS: "500", PORT: "99999" });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(EnvError);
    expect((error as EnvError).problems).toEqual([
      expect.stringMatching(/^PORT:/),
      "ENGRAM_DATADIR: not a setting Engram knows (did you mean ENGRAM_DATA_DIR?)",
      "ENGRAM_JOB_POL_MS: not a setting Engram knows (did you mean ENGRAM_JOB_POLL_MS?)",
    ]);
    // Names that are not settings but that tests, CI and a user's shell hold are left alone, as is anything not ENGRAM_*.
    const theirs = { ENGRAM_TEST_DATABASE_URL: "postgres://h/db", ENGRAM_REQUIRE_BROWSER: "1", ENGRAM_KEY: "egm_x", ENGRAM_ADMIN_KEY: "egm_y", HOME: "/root" };
    expect(() => readEnv(theirs)).not.toThrow();
    expect(ignoredNames(theirs)).toEqual([]);
  });

  it("stops on a setting's name with a part left off or ENGRAM_ put before it, and only warns about a name far from every setting", () => {
    for (const [name, meant] of [
      ["ENGRAM_MODEL_TIMEOUT", "ENGRAM_MODEL_TIMEOUT_MS"],
      ["ENGRAM_REPLY_TIMEOUT_MS", "ENGRAM_REPLY_MODEL_TIMEOUT_MS"],
      ["ENGRAM_PORT", "PORT"],
      ["ENGRAM_DATABASE_URL", "DATABASE_URL"],
    ]) {
      expect(() => readEnv({ [name]: "5000" }), name).toThrow(`${name}: not a setting Engram knows (did you mean ${meant}?)`);
    }
    // Another program's variable in the same environment (the peers harness passes ENGRAM_DIR to the server it starts).
    const env = { ENGRAM_DIR: "/tmp/engram-checkout", ENGRAM_CONFIG: "x" };
    expect(() => readEnv(env)).not.toThrow();
    expect(ignoredNames(env)).toEqual([
      "ENGRAM_DIR is not a setting Engram knows, and is ignored (the closest is ENGRAM_URL)",
      "ENGRAM_CONFIG is not a setting Engram knows, and is ignored (the closest is ENGRAM_JOBS)",
    ]);
  });
});

describe("the embedded store", { timeout: 120_000 }, () => {
  it("has one owner: a second owner of the data folder is refused, while attaching works", async () => {
    const dir = tempDir();
    const owner = await startEmbeddedStore(dir);
    cleanups.push(() => owner.stop());
    expect(readOwner(dir)?.pid).toBe(process.pid);

    await expect(startEmbeddedStore(dir)).rejects.toThrow(StoreBusyError);
    await expect(startEmbeddedStore(dir)).rejects.toThrow(/already opened by Engram/);

    const attached = await attachOrStartEmbeddedStore(dir);
    expect(attached.url).toBe(owner.url);
    await migrate(owner.url);
    const [row] = await sql<{ n: string }>(attached.url, `SELECT count(*)::text AS n FROM "_engram_migrations"`);
    expect(Number(row.n)).toBeGreaterThan(0);
    await attached.stop();
    // Attaching only reads the running server's password: with none whole there, the command is
    // refused in one line, and the file is left as it was (a new password would lock out both).
    const secret = path.join(dir, "store.secret");
    const password = readFileSync(secret, "utf8");
    writeFileSync(secret, "cut");
    await expect(attachOrStartEmbeddedStore(dir)).rejects.toThrow(StoreSecretError);
    await expect(attachOrStartEmbeddedStore(dir)).rejects.toThrow(/no whole store.secret/);
    expect(readFileSync(secret, "utf8")).toBe("cut");
    writeFileSync(secret, password);
    // Stopping an attached store leaves the owner's store up.
    const [still] = await sql<{ one: number }>(owner.url, "SELECT 1 AS one");
    expect(still.one).toBe(1);

    await owner.stop();
    expect(readOwner(dir)).toBeNull();
    const next = await startEmbeddedStore(dir);
    cleanups.push(() => next.stop());
    const [kept] = await sql<{ n: string }>(next.url, `SELECT count(*)::text AS n FROM "_engram_migrations"`);
    expect(kept.n).toBe(row.n);
    await next.stop();
  });

  it("is for the folder's owner only: the folder is private, and the port asks for the folder's password", async () => {
    const dir = tempDir();
    const store = await startEmbeddedStore(dir);
    cleanups.push(() => store.stop());
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(statSync(path.join(dir, "store.secret")).mode & 0o777).toBe(0o600);
    const [one] = await sql<{ one: number }>(store.url, "SELECT 1 AS one");
    expect(one.one).toBe(1);
    // Another user of the machine knows the port, not the password.
    const url = new URL(store.url);
    for (const password of ["", "wrong"]) {
      url.password = password;
      await expect(sql(url.toString(), "SELECT 1")).rejects.toThrow(/password/);
    }
    // The port still serves its owner after a refused client.
    const [again] = await sql<{ one: number }>(store.url, "SELECT 1 AS one");
    expect(again.one).toBe(1);
    // A client that connects and never gives the password is cut off, not left holding a place.
    const silent = net.connect(Number(url.port), "127.0.0.1");
    const closedAt = await new Promise<number>((resolve, reject) => {
      silent.once("close", () => resolve(Date.now()));
      silent.once("error", reject);
    });
    expect(closedAt).toBeGreaterThan(0);
    // Clients that connect and say nothing, more of them than the store has places, never keep its
    // owner out: they do not take a place until logged in, and the newest cut off the oldest.
    const silentMany = await Promise.all(
      Array.from({ length: 40 }, () => new Promise<net.Socket>((resolve, reject) => {
        const socket = net.connect(Number(url.port), "127.0.0.1", () => resolve(socket));
        socket.once("error", reject);
      })),
    );
    const [through] = await sql<{ one: number }>(store.url, "SELECT 1 AS one");
    expect(through.one).toBe(1);
    for (const socket of silentMany) socket.destroy();
    // Engram's own connections arriving together while PGlite is busy (its pools open up to 11)
    // are accepted before any has logged in: none may cut another off.
    const busy = sql(store.url, "SELECT pg_sleep(1)");
    await new Promise((resolve) => setTimeout(resolve, 200));
    const together = await Promise.allSettled(Array.from({ length: 16 }, () => sql<{ one: number }>(store.url, "SELECT 1 AS one")));
    expect(together.filter((r) => r.status === "rejected")).toEqual([]);
    await busy;
    await store.stop();
    // A secret cut short (a full disk between its creation and its write) is made again, never used empty.
    writeFileSync(path.join(dir, "store.secret"), "");
    const next = await startEmbeddedStore(dir);
    cleanups.push(() => next.stop());
    expect(readFileSync(path.join(dir, "store.secret"), "utf8")).toMatch(/^[\w-]{32}$/);
    url.password = "";
    await expect(sql(url.toString().replace(/:\d+\//, `:${new URL(next.url).port}/`), "SELECT 1")).rejects.toThrow(/password/);
    const [fresh] = await sql<{ one: number }>(next.url, "SELECT 1 AS one");
    expect(fresh.one).toBe(1);
    await next.stop();
  }, 60_000);

  it("creates a new database folder from the template npm ci made, or by initdb without one, whole or not at all", async () => {
    const init = path.join(ROOT, "src", "embedded", "pglite-init.mjs");
    const run = (...args: string[]) => spawnSync(process.execPath, ["--liftoff-only", init, ...args], { encoding: "utf8" });
    const dir = tempDir();

    // The template is made by `npm ci` (postinstall), replacing one of an earlier PGlite; a second
    // run leaves it as it is.
    const template = path.join(dir, "pglite-9.9.9-datadir.tar.gz");
    writeFileSync(path.join(dir, "pglite-0.0.1-datadir.tar.gz"), "an older PGlite's");
    expect(run("--template", template).status).toBe(0);
    const made = statSync(template).mtimeMs;
    expect(run("--template", template).status).toBe(0);
    expect(statSync(template).mtimeMs).toBe(made);
    expect(readdirSync(dir)).toEqual(["pglite-9.9.9-datadir.tar.gz"]);

    // A leftover of a creation whose process died is cleared first.
    const dead = spawnSync(process.execPath, ["-e", ""]).pid;
    mkdirSync(path.join(dir, `a.new-${dead}`));
    const fromTemplate = run(path.join(dir, "a"), template);
    expect(fromTemplate.status).toBe(0);
    expect(fromTemplate.stdout.trim()).toBe("template");
    // No template, or one that cannot be unpacked (said on stderr): initdb makes the folder instead.
    const noTemplate = run(path.join(dir, "b"), path.join(dir, "missing.tar.gz"));
    expect(noTemplate.stdout.trim()).toBe("initdb");
    expect(noTemplate.stderr).toMatch(/no database template at .*missing\.tar\.gz/);
    writeFileSync(path.join(dir, "broken.tar.gz"), "not a tarball");
    const broken = run(path.join(dir, "c"), path.join(dir, "broken.tar.gz"));
    expect(broken.stdout.trim()).toBe("initdb");
    expect(broken.stderr).toMatch(/could not be unpacked .*running initdb instead/);
    expect(readdirSync(dir).sort()).toEqual(["a", "b", "broken.tar.gz", "c", "pglite-9.9.9-datadir.tar.gz"]);

    // A folder that holds something other than a database is left alone, with a reason.
    mkdirSync(path.join(dir, "d"));
    writeFileSync(path.join(dir, "d", "notes.txt"), "mine");
    const occupied = run(path.join(dir, "d"), template);
    expect(occupied.status).not.toBe(0);
    expect(occupied.stderr).toMatch(/holds files but no database/);
    expect(readdirSync(path.join(dir, "d"))).toEqual(["notes.txt"]);
    expect(run(path.join(dir, "a"), template).stderr).toMatch(/already holds a database/);

    // Each folder made either way opens as a database and takes Engram's migrations.
    for (const name of ["a", "b", "c"]) {
      const data = path.join(dir, `store-${name}`);
      mkdirSync(data);
      renameSync(path.join(dir, name), path.join(data, "pg"));
      const store = await startEmbeddedStore(data);
      cleanups.push(() => store.stop());
      await migrate(store.url);
      const [row] = await sql<{ n: string }>(store.url, `SELECT count(*)::text AS n FROM "_engram_migrations"`);
      expect(Number(row.n)).toBe(committedMigrations().length);
      await store.stop();
    }
  });

  it("takes over a folder whose owner died without cleaning up", async () => {
    const dir = tempDir();
    const dead = spawnSync(process.execPath, ["-e", ""]).pid;
    writeFileSync(path.join(dir, "engram.owner.json"), JSON.stringify({ pid: dead, port: 1 }));
    expect(readOwner(dir)).toBeNull();
    const store = await startEmbeddedStore(dir);
    cleanups.push(() => store.stop());
    expect(readOwner(dir)?.pid).toBe(process.pid);
    await store.stop();
  });

  it("gives the jobs its last owner was running back to the queue, due now, leaves the others as they were, and ends the runs it was recording", async () => {
    const env = readEnv({ ENGRAM_LOG_LEVEL: "error", ENGRAM_DATA_DIR: tempDir() });
    const first = await openServices(env, { log: createLogger("error") });
    await first.queue.enqueue(summarizeJob, { tenantId: "t", conversationId: "running" });
    await first.queue.enqueue(summarizeJob, { tenantId: "t", conversationId: "waiting" }, { delayMs: 3_600_000 });
    // As Agenda leaves a one-off job while it runs: locked, and no next run until the run ends.
    await first.db.$executeRaw`
      UPDATE "agenda_jobs" SET "locked_at" = now(), "last_run_at" = now(), "next_run_at" = NULL WHERE "data"->>'conversationId' = 'running'`;
    // And the run it was recording (jobRuns, the inspector's feed).
    const run = await first.db.jobRun.create({ data: { tenantId: "t", name: "memory.compact", status: "RUNNING" } });
    await first.close();

    const second = await openServices(env, { log: createLogger("error") });
    cleanups.push(() => second.close());
    const rows = await second.db.$queryRaw<{ conversationId: string; lockedAt: Date | null; nextRunAt: Date | null }[]>`
      SELECT "data"->>'conversationId' AS "conversationId", "locked_at" AS "lockedAt", "next_run_at" AS "nextRunAt" FROM "agenda_jobs" ORDER BY 1`;
    expect(rows.map((r) => [r.conversationId, r.lockedAt])).toEqual([["running", null], ["waiting", null]]);
    expect(rows[0].nextRunAt!.getTime()).toBeLessThanOrEqual(Date.now());
    expect(rows[1].nextRunAt!.getTime()).toBeGreaterThan(Date.now() + 3_000_000);
    expect(await second.db.jobRun.findUniqueOrThrow({ where: { id: run.id } })).toMatchObject({
      status: "FAILED",
      error: expect.stringMatching(/stopped before it finished/),
      finishedAt: expect.any(Date),
    });
    await second.close();
  });

  it("takes over a folder whose owner file names this process, or a PID another process has now", async () => {
    // A file naming this process, which never wrote it: an earlier process had its PID.
    const self = tempDir();
    writeFileSync(path.join(self, "engram.owner.json"), JSON.stringify({ pid: process.pid, port: 1 }));
    expect(readOwner(self)).toBeNull();
    const store = await startEmbeddedStore(self);
    cleanups.push(() => store.stop());
    expect(readOwner(self)).toMatchObject({ pid: process.pid, started: processStarted(process.pid) });
    await store.stop();

    // A live process that is not the one recorded: it started at another time.
    const sleeper = spawn("sleep", ["120"], { stdio: "ignore" });
    children.add(sleeper);
    const started = processStarted(sleeper.pid!)!;
    const reused = tempDir();
    writeFileSync(path.join(reused, "engram.owner.json"), JSON.stringify({ pid: sleeper.pid, started: started - 1, port: 1 }));
    const next = await startEmbeddedStore(reused);
    cleanups.push(() => next.stop());
    expect(readOwner(reused)?.pid).toBe(process.pid);
    await next.stop();

    // The process recorded, still running, still holds its folder.
    const held = tempDir();
    writeFileSync(path.join(held, "engram.owner.json"), JSON.stringify({ pid: sleeper.pid, started, port: 1 }));
    await expect(startEmbeddedStore(held)).rejects.toThrow(new RegExp(`already opened by Engram \\(pid ${sleeper.pid}\\)`));
    sleeper.kill("SIGKILL");
  });

  it("never opens a folder whose database process outlives its killed server: waits for it, or refuses", { timeout: 240_000 }, async () => {
    const dir = tempDir();
    const server = await startServer({ ENGRAM_DATA_DIR: dir });
    const recorded = readOwnerFile(path.join(dir, "engram.owner.json"))!;
    expect(recorded).toMatchObject({ pid: server.child.pid, child: { pid: expect.any(Number), started: expect.any(Number) } });
    const orphan = recorded.child!.pid;
    cleanups.push(() => {
      try {
        process.kill(orphan, "SIGKILL");
      } catch {} // gone already
    });
    const pgliteChildren = () =>
      readdirSync("/proc")
        .filter((name) => /^\d+$/.test(name))
        .filter((pid) => {
          try {
            const args = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
            return args.some((arg) => arg.endsWith("pglite-child.mjs")) && args.includes(path.join(dir, "pg"));
          } catch {
            return false;
          }
        })
        .map(Number);
    expect(pgliteChildren()).toEqual([orphan]);

    // The database process is held while its server is killed: it cannot close the folder.
    process.kill(orphan, "SIGSTOP");
    const killed = new Promise((resolve) => server.child.once("exit", resolve));
    server.child.kill("SIGKILL");
    await killed;
    const refused = await startEmbeddedStore(dir, { orphanWaitMs: 1_000 }).catch((error: Error) => error);
    expect(refused).toBeInstanceOf(StoreBusyError);
    expect((refused as Error).message).toMatch(new RegExp(`still open in the database process \\(pid ${orphan}\\) of an Engram that exited`));
    expect(pgliteChildren()).toEqual([orphan]);

    // Let go, it closes the folder and exits: a start meanwhile waits for it, then opens the folder.
    const starting = startEmbeddedStore(dir);
    setTimeout(() => process.kill(orphan, "SIGCONT"), 500);
    const store = await starting;
    cleanups.push(() => store.stop());
    const [opened] = pgliteChildren();
    expect(pgliteChildren()).toEqual([opened]);
    expect(opened).not.toBe(orphan);
    const [row] = await sql<{ one: number }>(store.url, "SELECT 1 AS one");
    expect(row.one).toBe(1);
    await store.stop();
  });

  it.skipIf(process.platform !== "linux" || spawnSync("unshare", ["--pid", "--fork", "--mount-proc", "true"]).status !== 0)(
    "starts as PID 1 of a container over the owner file a killed PID 1 left",
    async () => {
      const dir = tempDir();
      writeFileSync(path.join(dir, "engram.owner.json"), JSON.stringify({ pid: 1, port: 1 }));
      const script = path.join(dir, "start.mts");
      writeFileSync(
        script,
        `import { readOwner, startEmbeddedStore } from ${JSON.stringify(path.join(ROOT, "src", "embedded", "embedded.ts"))};
const store = await startEmbeddedStore(${JSON.stringify(dir)});
console.log(JSON.stringify({ pid: process.pid, owner: readOwner(${JSON.stringify(dir)}) }));
await store.stop();
`,
      );
      const run = spawnSync("unshare", ["--pid", "--fork", "--mount-proc", process.execPath, "--import", "tsx", script], {
        cwd: ROOT,
        encoding: "utf8",
        timeout: 90_000,
      });
      expect(run.status, run.stderr).toBe(0);
      const { pid, owner } = JSON.parse(run.stdout.trim().split("\n").pop()!);
      expect(pid).toBe(1);
      expect(owner).toMatchObject({ pid: 1, started: expect.any(Number) });
    },
  );
});

describe("the CLI", () => {
  it("prints just a key for `tenants create` and `keys create`, and the keys work", { timeout: 240_000 }, async () => {
    const store = await testStore();
    const created = await cli(["tenants", "create", "acme"], store.vars);
    // The new tenant's id goes to stderr, so `keys create --tenant` can use it; stdout is the key alone.
    expect(created.stderr).toMatch(/^tenant \S+/);
    expect(created.code).toBe(0);
    expect(created.stdout.endsWith("\n")).toBe(true);
    const adminKey = created.stdout.trimEnd();
    expect(adminKey).toMatch(KEY);

    const reader = await cli(["keys", "create", "--role", "reader"], store.vars);
    expect(reader.code).toBe(0);
    const readerKey = reader.stdout.trimEnd();
    expect(readerKey).toMatch(KEY);
    expect(readerKey).not.toBe(adminKey);

    // The keys open the API of a server on that store.
    const env = readEnv({ ENGRAM_LOG_LEVEL: "error", ...store.vars });
    const services = await openServices(env, { log: createLogger("error") });
    cleanups.push(() => services.close());
    const app = buildApp(services);
    const url = await app.start(0, "127.0.0.1");
    cleanups.push(() => app.stop());
    const asReader = await viewer(url, readerKey);
    expect(asReader.errors).toBeUndefined();
    expect(asReader.data?.viewer).toMatchObject({ role: "READER", tenant: { name: "acme" } });
    expect((await viewer(url, adminKey)).data?.viewer.role).toBe("ADMIN");
    expect((await viewer(url, "egm_not-a-key")).data?.viewer).toBeFalsy();

    // While the server runs, the CLI goes through its store rather than opening the folder again.
    const tenantId = asReader.data!.viewer.tenant.id;
    const writer = await cli(["keys", "create", "--role", "writer", "--tenant", tenantId], store.vars);
    expect(writer.stderr).toBe("");
    expect(writer.code).toBe(0);
    const writerKey = writer.stdout.trimEnd();
    expect(writerKey).toMatch(KEY);
    expect((await viewer(url, writerKey)).data?.viewer).toMatchObject({ role: "WRITER", tenant: { id: tenantId } });
    if (store.kind === "embedded") expect(readOwner(store.vars.ENGRAM_DATA_DIR)?.pid).toBe(process.pid);

    // Mistakes are said on stderr with a non-zero exit, and print no key.
    const badRole = await cli(["keys", "create", "--role", "owner"], store.vars);
    expect(badRole.code).not.toBe(0);
    expect(badRole.stdout).toBe("");
    expect(badRole.stderr).toMatch(/--role must be admin, writer or reader/);

    await app.stop();
    await services.close();
  });
});

describe("first start of the server", () => {
  it("prints the admin key once, on a line of its own; a second start does not", { timeout: 240_000 }, async () => {
    const store = await testStore();

    const first = await startServer(store.vars);
    // The first tenant is made once the server listens, so its key follows the listening line.
    for (let waited = 0; !first.output.stdout.includes("ENGRAM_ADMIN_KEY=") && waited < 30_000; waited += 100) {
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const keyLines = first.output.stdout.split("\n").filter((line) => line.startsWith("ENGRAM_ADMIN_KEY="));
    expect(keyLines).toHaveLength(1);
    const adminKey = keyLines[0].slice("ENGRAM_ADMIN_KEY=".length);
    expect(adminKey).toMatch(KEY);
    expect(first.output.stderr).not.toContain(adminKey);
    const asAdmin = await viewer(first.url, adminKey);
    expect(asAdmin.errors).toBeUndefined();
    expect(asAdmin.data?.viewer).toMatchObject({ role: "ADMIN", tenant: { name: "default" } });
    expect(await first.stop()).toBe(0);

    const second = await startServer(store.vars);
    expect(second.output.stdout).not.toContain("ENGRAM_ADMIN_KEY");
    // The key printed the first time still works.
    expect((await viewer(second.url, adminKey)).data?.viewer.role).toBe("ADMIN");
    expect(await second.stop()).toBe(0);
    expect(second.output.stdout).not.toContain("ENGRAM_ADMIN_KEY");
  });
});
