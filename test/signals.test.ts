import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import http from "node:http";
import path from "node:path";
import { afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import {
  adminKeyOf,
  ensureCompiled,
  freePort,
  killAll,
  processTree,
  ROOT,
  startServer,
  survivors,
  tempDataDir,
  waitAllGone,
  type ServerProcess,
} from "./helpers/server-process.ts";
import { until } from "./helpers/until.ts";

// Processes start slowly on a loaded machine: generous limits (behaviour, not speed, is tested).
vi.setConfig({ testTimeout: 300_000, hookTimeout: 300_000 });

// Whatever a supervisor signals (npm, node, the whole group) the server stops in order, its
// children (PGlite, Chroma) with it, and the data folder is left unlocked. After a SIGKILL the
// children notice on their own and the next start works. Generous timeouts: behaviour, not speed.

const RECORD_TURN = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { id } }`;

let current: { server: ServerProcess; pids: number[] } | undefined;

beforeAll(() => ensureCompiled());
afterEach(() => {
  if (current) killAll(current.pids, current.server.dataDir);
  current = undefined;
});

/**
 * Records a turn, so the stop has written data and a recall index to close, and waits until the
 * embedded Chroma (which the server starts as it starts) has taken its lock.
 */
async function startChroma(server: ServerProcess) {
  const key = await adminKeyOf(server);
  const response = await fetch(`${server.url}/graphql`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({
      query: RECORD_TURN,
      variables: {
        input: {
          agentExternalId: "concierge",
          endUserExternalId: "guest-1",
          conversationExternalId: "c-1",
          clientTurnId: "t-1",
          userMessage: "A quiet room, please.",
          assistantMessage: "Noted.",
        },
      },
    }),
  });
  expect((await response.json()).errors).toBeUndefined();
  await until("the embedded Chroma to start", async () => existsSync(path.join(server.dataDir, "chroma.owner.json")), 120_000);
}

const locks = (dataDir: string) =>
  ["engram.owner.json", "chroma.owner.json"].filter((name) => existsSync(path.join(dataDir, name)));

async function start(via: "npm" | "node", options: { chroma?: boolean; dataDir?: string } = {}) {
  const server = await startServer({ via, dataDir: options.dataDir });
  current = { server, pids: [] };
  if (options.chroma) await startChroma(server);
  // The whole tree as it runs: npm, node and the PGlite child, which also runs Chroma once started.
  current.pids = processTree(server.child.pid!);
  const children = current.pids.length - (via === "npm" ? 2 : 1);
  expect(children).toBe(1);
  return current;
}

describe("stopping under a supervisor", () => {
  it("npm start runs node and its children with two malloc arenas; SIGTERM to npm stops them all and leaves no lock", async () => {
    const { server, pids } = await start("npm", { chroma: true });
    const arenas = (pid: number) =>
      readFileSync(`/proc/${pid}/environ`, "utf8").split("\0").find((entry) => entry.startsWith("MALLOC_ARENA_MAX="));
    const engram = pids.filter((pid) => pid !== server.child.pid);
    expect(engram.map(arenas)).toEqual(engram.map(() => `MALLOC_ARENA_MAX=${process.env.MALLOC_ARENA_MAX || "2"}`));
    process.kill(server.child.pid!, "SIGTERM");
    const ms = await waitAllGone(pids, server.dataDir);
    expect(locks(server.dataDir)).toEqual([]);
    await server.drained();
    expect(server.output()).toMatch(/store closed; bye/);
    console.log(`SIGTERM to npm: every process gone in ${ms} ms`);
  });

  it("SIGTERM to node stops it in order", async () => {
    const { server, pids } = await start("npm");
    const node = pids.find((pid) => readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("dist/main.js"))!;
    expect(node).not.toBe(server.child.pid);
    process.kill(node, "SIGTERM");
    const ms = await waitAllGone(pids, server.dataDir);
    expect(locks(server.dataDir)).toEqual([]);
    await server.drained();
    expect(server.output()).toMatch(/shutting down.*SIGTERM[\s\S]*store closed; bye/);
    console.log(`SIGTERM to node: every process gone in ${ms} ms`);
  });

  it("SIGTERM with the store's process frozen: the store is killed, and the log and the exit code say it was not closed", async () => {
    const { server, pids } = await start("node");
    const [child] = pids.filter((pid) => pid !== server.child.pid);
    process.kill(child, "SIGSTOP");
    process.kill(server.child.pid!, "SIGTERM");
    // It said "store closed; bye" and exited 0 after killing the frozen database process, or, when
    // the 9 s deadline came first, exited and left that process frozen for good.
    expect(await server.exited).toEqual({ code: 1, signal: null });
    await waitAllGone(pids, server.dataDir);
    await server.drained();
    // Killed by the store's stop after 8 s, or as the process exits at its 9 s deadline, whichever comes first.
    expect(server.output()).toMatch(/did not close within 8 s and was killed|shutdown took over 9 s/);
    expect(server.output()).not.toMatch(/store closed; bye/);
    // What a killed store leaves behind does not hold the next start.
    const next = await startServer({ via: "node", dataDir: server.dataDir });
    current = { server: next, pids: processTree(next.child.pid!) };
    process.kill(next.child.pid!, "SIGTERM");
    expect(await next.exited).toEqual({ code: 0, signal: null });
    await waitAllGone(current.pids, next.dataDir);
    expect(locks(next.dataDir)).toEqual([]);
  });

  it("SIGTERM to the whole process group stops everything in order", async () => {
    const { server, pids } = await start("npm", { chroma: true });
    process.kill(-server.pgid, "SIGTERM");
    const ms = await waitAllGone(pids, server.dataDir);
    expect(locks(server.dataDir)).toEqual([]);
    await server.drained();
    expect(server.output()).toMatch(/store closed; bye/);
    console.log(`SIGTERM to the group: every process gone in ${ms} ms`);
  });

  it("SIGHUP to the whole process group stops everything in order, the store's child included", async () => {
    const { server, pids } = await start("node");
    process.kill(-server.pgid, "SIGHUP");
    await waitAllGone(pids, server.dataDir);
    expect(locks(server.dataDir)).toEqual([]);
    await server.drained();
    expect(server.output()).toMatch(/shutting down.*SIGHUP[\s\S]*store closed; bye/);
    // The child waited for Engram's stop instead of dying of the signal (which read as a crash).
    expect(server.output()).not.toMatch(/restarting/);
  });

  it("SIGTERM lets a request in flight finish, refuses new ones, and still stops within its budget", async () => {
    const { server, pids } = await start("node");
    const key = await adminKeyOf(server);
    // A request whose body is still arriving when the signal comes (as one waiting on a model is).
    const body = JSON.stringify({ query: "{ viewer { role } }" });
    const { hostname, port } = new URL(server.url);
    const request = http.request({
      hostname,
      port,
      path: "/graphql",
      method: "POST",
      headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body), authorization: `Bearer ${key}` },
    });
    const answer = new Promise<{ status: number; text: string }>((resolve, reject) => {
      request.once("error", reject);
      request.once("response", (response) => {
        let text = "";
        response.on("data", (chunk) => (text += chunk));
        response.once("end", () => resolve({ status: response.statusCode!, text }));
      });
    });
    request.write(body.slice(0, 10));
    await new Promise((resolve) => setTimeout(resolve, 500));
    const signalled = Date.now();
    process.kill(server.child.pid!, "SIGTERM");
    await until("shutdown to begin", async () => /shutting down/.test(server.output()), 10_000);
    const late = await fetch(`${server.url}/graphql`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body,
    }).then((response) => response.status, (error: Error) => error.message);
    expect([503, "fetch failed"]).toContain(late);
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    request.end(body.slice(10));
    const { status, text } = await answer;
    expect(status).toBe(200);
    expect(JSON.parse(text).data.viewer.role).toBe("ADMIN");
    await waitAllGone(pids, server.dataDir);
    expect(await server.exited).toEqual({ code: 0, signal: null });
    await server.drained();
    expect(server.output()).toMatch(/API stopped[\s\S]*store closed; bye/);
    expect(server.output()).not.toMatch(/shutdown took over|cut off/);
    console.log(`SIGTERM with a request in flight: answered ${status}, every process gone ${Date.now() - signalled} ms after the signal`);
  });

  it("starts the embedded Chroma with the server, before any request needs it", async () => {
    // No job worker (whose sweeps use Chroma too) and no request: only the server's start asks for it.
    const server = await startServer({ via: "node", env: { ENGRAM_JOBS: "off" } });
    current = { server, pids: processTree(server.child.pid!) };
    // It runs in the PGlite child, not in a process of its own.
    await until("the embedded Chroma to start", async () => existsSync(path.join(server.dataDir, "chroma.owner.json")), 120_000);
    await until("/healthz to report it up", async () => {
      const { components } = await (await fetch(`${server.url}/healthz`)).json();
      return components.chroma.status === "ok" && components.chroma.detail === "embedded";
    }, 60_000);
    expect(processTree(server.child.pid!)).toHaveLength(2);
  });

  it("a store's child whose Engram exits while the child is still loading ends by itself, and opens nothing", async () => {
    // The parent forks the child and exits at once, before the child's code has run: its IPC
    // channel's end and its new parent both come before the child watches for them.
    const dataDir = tempDataDir("engram-early-exit-");
    const forkAndExit = (script: string, args: string[]) => {
      const parent = `const { fork } = require("node:child_process");
const child = fork(${JSON.stringify(path.join(ROOT, "src", "embedded", script))}, ${JSON.stringify(args)},
  { stdio: "ignore", env: { ...process.env, ENGRAM_STORE_PASSWORD: "p".repeat(32) } });
process.stdout.write(String(child.pid));
process.exit(0);`;
      const run = spawnSync(process.execPath, ["-e", parent], { encoding: "utf8" });
      expect(run.status, run.stderr).toBe(0);
      return Number(run.stdout);
    };
    const pids = [
      forkAndExit("pglite-child.mjs", [path.join(dataDir, "pg"), "32", "0", "15000", "120000"]),
      forkAndExit("chroma-child.mjs", [ROOT, path.join(dataDir, "chroma"), String(await freePort())]),
    ];
    current = { server: { dataDir } as ServerProcess, pids };
    // Before the fix both ran for good, re-parented to init: PGlite serving the folder, Chroma its port.
    await waitAllGone(pids, dataDir, 30_000);
    expect(survivors(pids, dataDir)).toEqual([]);
    expect(readdirSync(dataDir)).toEqual([]);
  });

  // SIGKILL to node under write load (children exit by themselves, the next start works): test/faults/server-kill.test.ts.
});
