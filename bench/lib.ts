import { forTenant } from "../src/db.ts";
// Shared by the benchmarks: stores to run on, a bounded concurrent runner, percentiles, and the
// README section each benchmark owns.
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { readEnv } from "../src/env.ts";
import { createLogger } from "../src/log.ts";
import { createTenant } from "../src/auth.ts";
import { createApiKey } from "../src/governance/keys.ts";
import { openServices, type Services } from "../src/services.ts";
import {
  createEmbeddedStore as createEmbeddedTestStore,
  createPostgresStore as createPostgresTestStore,
  type TestStore,
} from "../test/helpers/store.ts";

export const README = fileURLToPath(new URL("./README.md", import.meta.url));

/** Where PostgreSQL runs are made: a fresh database is created on this server for each one. */
export const POSTGRES_SERVER_URL = process.env.BENCH_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";

export type BenchStore = TestStore;
export type StoreKind = BenchStore["kind"];

/** An embedded store in a temporary folder, removed by drop(). */
export function createEmbeddedStore(): BenchStore {
  return createEmbeddedTestStore("bench");
}

/** A fresh database on the PostgreSQL server, dropped by drop(); null when the server is not there. */
export async function createPostgresStore(serverUrl = POSTGRES_SERVER_URL): Promise<BenchStore | null> {
  return createPostgresTestStore(serverUrl, {
    label: "bench",
    connectionTimeoutMillis: 3_000,
    onUnreachable: (error) => {
      console.warn(`PostgreSQL at ${redact(serverUrl)} is unreachable (${error.message}): skipping it.`);
      return null;
    },
  });
}

function redact(url: string) {
  const parsed = new URL(url);
  if (parsed.password) parsed.password = "***";
  return parsed.toString();
}

/**
 * The stores a benchmark runs on, in order (BENCH_STORES=embedded or =postgres picks one).
 * PostgreSQL is left out when unreachable, and the reason is pushed onto `skipped`.
 */
export async function* benchStores(skipped: string[] = []): AsyncGenerator<BenchStore> {
  const wanted = new Set((process.env.BENCH_STORES ?? "embedded,postgres").split(",").map((s) => s.trim()));
  if (wanted.has("embedded")) yield createEmbeddedStore();
  if (!wanted.has("postgres")) return;
  const postgres = await createPostgresStore();
  if (postgres) yield postgres;
  else skipped.push(`PostgreSQL (${redact(POSTGRES_SERVER_URL)} unreachable)`);
}

export type BenchEngram = { services: Services; tenantId: string; writerKey: string; readerKey: string };

/** Engram's services on a store (migrations applied, no jobs) with one tenant and its keys. */
export async function openBenchEngram(store: BenchStore, env: Record<string, string> = {}): Promise<BenchEngram> {
  const parsed = readEnv({ ENGRAM_LOG_LEVEL: process.env.BENCH_LOG_LEVEL ?? "error", ENGRAM_JOBS: "off", ...store.vars, ...env });
  const services = await openServices(parsed, { log: createLogger(parsed.ENGRAM_LOG_LEVEL) });
  const { tenant } = await createTenant(services.db, { name: "bench" });
  const writer = await createApiKey(forTenant(services.db, tenant.id), { role: "WRITER", name: "bench writer" }, { apiKeyId: null, via: "cli" });
  const reader = await createApiKey(forTenant(services.db, tenant.id), { role: "READER", name: "bench reader" }, { apiKeyId: null, via: "cli" });
  return { services, tenantId: tenant.id, writerKey: writer.key, readerKey: reader.key };
}

/**
 * Counts the SQL statements sent through pg.Client#query, which every statement takes (the
 * Prisma adapter's pool included). Installed once per process; `record` keeps their text too.
 */
export function sqlStatementCounter() {
  const state = { count: 0, elapsedMs: 0, recording: null as string[] | null };
  const clientQuery = pg.Client.prototype.query;
  pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    state.count++;
    if (state.recording) {
      const first = args[0] as string | { text?: string };
      state.recording.push(typeof first === "string" ? first : (first?.text ?? String(first)));
    }
    const started = performance.now();
    const done = () => {
      state.elapsedMs += performance.now() - started;
    };
    // pg-pool's query (what the Prisma adapter uses) passes a callback; direct calls get a promise.
    const last = args.length - 1;
    if (typeof args[last] === "function") {
      const callback = args[last] as (...a: unknown[]) => unknown;
      args[last] = (...results: unknown[]) => {
        done();
        return callback(...results);
      };
    }
    const result = (clientQuery as (...a: unknown[]) => unknown).apply(this, args);
    if (typeof args[last] !== "function" && result && typeof (result as Promise<unknown>).then === "function") {
      (result as Promise<unknown>).then(done, done);
    }
    return result;
  } as typeof clientQuery;
  return {
    get count() {
      return state.count;
    },
    /** Milliseconds from sending each statement to its result, summed. */
    get elapsedMs() {
      return state.elapsedMs;
    },
    /** The statements fn sends, in order. */
    async record(fn: () => Promise<unknown>): Promise<string[]> {
      state.recording = [];
      try {
        await fn();
        return state.recording;
      } finally {
        state.recording = null;
      }
    },
  };
}

export type RunResult = {
  count: number;
  concurrency: number;
  elapsedMs: number;
  perSecond: number;
  /** Milliseconds per operation, sorted ascending. */
  latencies: number[];
};

/** Runs op(0..count-1) keeping `concurrency` in flight; any failure stops the run. */
export async function runConcurrent(
  count: number,
  concurrency: number,
  op: (index: number) => Promise<unknown>,
): Promise<RunResult> {
  const latencies = new Array<number>(count);
  let next = 0;
  const started = performance.now();
  const lane = async () => {
    while (next < count) {
      const index = next++;
      const t0 = performance.now();
      await op(index);
      latencies[index] = performance.now() - t0;
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, lane));
  const elapsedMs = performance.now() - started;
  latencies.sort((a, b) => a - b);
  return { count, concurrency, elapsedMs, perSecond: (count * 1000) / elapsedMs, latencies };
}

/** Nearest-rank percentile of an ascending array. */
export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))];
}

/** A run's table cells: operations per second, then p50, p95 and p99 latency. */
export function rateAndPercentiles(run: RunResult): string[] {
  return [
    fmt(run.perSecond),
    fmt(percentile(run.latencies, 50), " ms"),
    fmt(percentile(run.latencies, 95), " ms"),
    fmt(percentile(run.latencies, 99), " ms"),
  ];
}

export function envInt(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value <= 0) throw new Error(`${name} must be a positive integer, not "${raw}".`);
  return value;
}

/** Rounds for a table: 3 significant digits under 100, whole numbers above, thousands separated. */
export function fmt(value: number, unit = ""): string {
  if (!Number.isFinite(value)) return "–";
  const text =
    Math.abs(value) >= 100
      ? Math.round(value).toLocaleString("en-US")
      : value.toPrecision(3).replace(/\.?0+$/, "");
  return `${text}${unit}`;
}

export const ratio = (a: number, b: number) => (Number.isFinite(a / b) ? `${(a / b).toFixed(2)}×` : "–");

/** A Markdown table; columns after the first are right-aligned. */
export function markdownTable(headers: string[], rows: (string | number)[][]): string {
  const cells = [headers, ...rows.map((row) => row.map(String))];
  const widths = headers.map((_, c) => Math.max(3, ...cells.map((row) => (row[c] ?? "").length)));
  const line = (row: string[]) =>
    `| ${row.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]) : cell.padStart(widths[c]))).join(" | ")} |`;
  const rule = `| ${widths.map((w, c) => (c === 0 ? "-".repeat(w) : `${"-".repeat(w - 1)}:`)).join(" | ")} |`;
  return [line(cells[0]), rule, ...cells.slice(1).map(line)].join("\n");
}

// Taken when the module loads, before a benchmark does any work: a busy machine skews everything.
const loadBefore = os.loadavg()[0];

/** Warns when something else is keeping the machine busy, since the numbers would be off. */
export function warnIfBusy(): void {
  if (loadBefore > os.cpus().length / 2) {
    console.warn(`The 1-minute load average is ${loadBefore.toFixed(2)} before starting: results will be noisy.`);
  }
}

/** One line saying where and when a result was measured. */
export function machineLine(): string {
  const cpus = os.cpus();
  const model = cpus[0]?.model.trim() ?? "unknown CPU";
  const memGb = (os.totalmem() / 1024 ** 3).toFixed(0);
  const when = new Date().toISOString().slice(0, 16).replace("T", " ");
  return (
    `${cpus.length} × ${model}, ${memGb} GB RAM, ${os.type()} ${os.release()}, Node ${process.version}, ` +
    `${when} UTC, 1-minute load average ${loadBefore.toFixed(2)} before the run`
  );
}

const INTRO = `# Engram benchmarks

Each benchmark runs against a real Engram (its services, and the HTTP server on a free loopback
port where the API is what is measured) on both stores in one run: the embedded store (PGlite
served over the PostgreSQL wire protocol from a child process, in a temporary folder) and
PostgreSQL (a fresh database on \`BENCH_DATABASE_URL\`, default
\`postgres://postgres@127.0.0.1:5432/postgres\`, dropped afterwards; skipped with a message when
the server is unreachable). Each script rewrites only its own section of this file, between its
\`<!-- name:start -->\` and \`<!-- name:end -->\` markers, and stamps it with the machine and date.

| Benchmark | Measures | Run |
| --- | --- | --- |
| Append | \`appendEvent\` over HTTP (auth, validation, insert, answer, publish with the feed row) against the same rows inserted straight through the Prisma client: events/s, p50/p95 latency, HTTP/raw and embedded/PostgreSQL ratios | \`npx tsx bench/append/run.ts\` |
| Context | the \`context\` query (in-process \`yoga.fetch\`, reader key) over 1,000 conversations × 200 messages with summaries, kept messages and curated entries: p50/p95/p99/mean, SQL statements per query | \`npx tsx bench/context/run.ts\` |
| Tokens | prompt tokens per turn on the LoCoMo conversations: Engram's summary + tail against the last 20 messages and the full history (a replay of the window rules in pure functions, checked turn by turn against the real code on the embedded store; no PostgreSQL run) | \`npx tsx bench/tokens/run.ts\` |

Shared helpers (stores, concurrent runner, percentiles, tables, README sections) are in
\`bench/lib.ts\`. Numbers depend on the machine: compare rows of one run, not runs of two machines.
`;

/**
 * Replaces the text between <!-- name:start --> and <!-- name:end --> in bench/README.md,
 * creating the file (with its intro) or appending the section when missing.
 */
export function writeReadmeSection(name: string, body: string, file = README): void {
  const start = `<!-- ${name}:start -->`;
  const end = `<!-- ${name}:end -->`;
  const block = `${start}\n${body.trim()}\n${end}`;
  const current = existsSync(file) ? readFileSync(file, "utf8") : INTRO;
  const from = current.indexOf(start);
  const to = current.indexOf(end);
  const next =
    from >= 0 && to > from
      ? current.slice(0, from) + block + current.slice(to + end.length)
      : `${current.trimEnd()}\n\n${block}\n`;
  writeFileSync(file, next);
}

/** "Measured on <machine>." for a README section, naming the stores that were skipped. */
export function measuredOn(skipped: string[]): string {
  return `Measured on ${machineLine()}.` + (skipped.length ? ` Skipped: ${skipped.join("; ")}.` : "");
}

/**
 * With BENCH_CPU_PROFILE=<dir>, the benchmark's own process (the server under test) is profiled
 * from start to end, written as <dir>/<name>.cpuprofile (open it in Chrome DevTools, or sum the
 * self time per function).
 */
async function startCpuProfile() {
  const dir = process.env.BENCH_CPU_PROFILE;
  if (!dir) return null;
  const { Session } = await import("node:inspector/promises");
  const session = new Session();
  session.connect();
  await session.post("Profiler.enable");
  await session.post("Profiler.setSamplingInterval", { interval: 1_000 });
  await session.post("Profiler.start");
  return {
    async stop(name: string) {
      const { profile } = await session.post("Profiler.stop");
      const { mkdirSync } = await import("node:fs");
      mkdirSync(dir, { recursive: true });
      writeFileSync(`${dir}/${name}.cpuprofile`, JSON.stringify(profile));
      session.disconnect();
      console.log(`CPU profile written to ${dir}/${name}.cpuprofile`);
    },
  };
}

/**
 * A benchmark's main: runs benchStore on each of benchStores() (dropping each store afterwards),
 * writes the report as its README section `name` and prints it; any failure exits with 1.
 */
export function runBenchmark<R>(
  name: string,
  benchStore: (store: BenchStore) => Promise<R>,
  report: (results: R[], skipped: string[]) => string,
): void {
  const main = async () => {
    warnIfBusy();
    const profile = await startCpuProfile();
    const started = performance.now();
    const results: R[] = [];
    const skipped: string[] = [];
    for await (const store of benchStores(skipped)) {
      try {
        results.push(await benchStore(store));
      } finally {
        await store.drop();
      }
    }
    await profile?.stop(name);
    const section = report(results, skipped);
    writeReadmeSection(name, section);
    console.log(`\n${section}\n\nbench/README.md updated (${((performance.now() - started) / 1000).toFixed(1)} s).`);
    // Agenda arms a lock check for each job it runs, half the lock's lifetime away (5 minutes), on a
    // timer it never unrefs or clears: after a worker-on bench the process stayed that long.
    process.exit(0);
  };
  main().catch((error) => {
    console.error(error);
    process.exit(1);
  });
}

export type TreeRss = { total: number; byName: Record<string, number> };

/** Resident MB of this process and every process under it (the PGlite child, with Chroma on its thread), from /proc. */
export function treeRss(): TreeRss {
  const byName: Record<string, number> = {};
  let total = 0;
  const stack = [process.pid];
  while (stack.length) {
    const pid = stack.pop()!;
    try {
      const status = readFileSync(`/proc/${pid}/status`, "utf8");
      const mb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0) / 1024;
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      const name = pid === process.pid ? "server (with the load generator)" : /pglite-child/.test(cmd) ? "PGlite" : /chroma/.test(cmd) ? "Chroma" : "other";
      byName[name] = (byName[name] ?? 0) + mb;
      total += mb;
      for (const task of readdirSync(`/proc/${pid}/task`)) {
        const children = readFileSync(`/proc/${pid}/task/${task}/children`, "utf8").trim();
        if (children) stack.push(...children.split(/\s+/).map(Number));
      }
    } catch {
      // gone meanwhile
    }
  }
  return { total, byName };
}

/** The process tree's peak resident memory, sampled every 250 ms until stopped. */
export function sampleTreeRss() {
  let peak = treeRss();
  const timer = setInterval(() => {
    const now = treeRss();
    if (now.total > peak.total) peak = now;
  }, 250);
  return {
    stop: () => clearInterval(timer),
    peak: () => peak,
  };
}

/** "1,234 MB (server 600, PGlite 500, …)". */
export const rssLine = (rss: TreeRss) =>
  `${fmt(rss.total)} MB (${Object.entries(rss.byName).map(([name, mb]) => `${name} ${fmt(mb)}`).join(", ")})`;
