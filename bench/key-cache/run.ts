// API-key lookups with the per-instance key cache (ENGRAM_KEY_CACHE_TTL_MS=1000, the default)
// against a lookup on every request (=0), over HTTP, on both stores. Run: npx tsx bench/key-cache/run.ts
import { buildApp } from "../../src/app.ts";
import {
  envInt,
  fmt,
  markdownTable,
  measuredOn,
  openBenchEngram,
  rateAndPercentiles,
  runBenchmark,
  runConcurrent,
  sqlStatementCounter,
  type BenchStore,
  type RunResult,
  type StoreKind,
} from "../lib.ts";

const N = envInt("BENCH_N", 2_000);
const WARMUP = envInt("BENCH_WARMUP", 200);
const CONCURRENCY = envInt("BENCH_CONCURRENCY", 8);

const statements = sqlStatementCounter();

const OPERATIONS = {
  // Nothing but the key check: the resolver answers from the caller's principal.
  viewer: { query: `{ viewer { role } }`, variables: () => ({}), key: "readerKey" },
  appendEvent: {
    query: `mutation($input: AppendEventInput!) { appendEvent(input: $input) { id } }`,
    variables: (i: number) => ({ input: { scope: "ENTITY", scopeRef: `c-${i % 25}`, kind: "note", body: "A short note about the call.", source: "bench" } }),
    key: "writerKey",
  },
} as const;

type Row = { kind: StoreKind; ttlMs: number; operation: keyof typeof OPERATIONS; run: RunResult; statementsPerOp: number };

async function measureWith(store: BenchStore, ttlMs: number): Promise<Row[]> {
  const engram = await openBenchEngram(store, { ENGRAM_KEY_CACHE_TTL_MS: String(ttlMs) });
  const app = buildApp(engram.services);
  const rows: Row[] = [];
  try {
    const url = `${await app.start(0, "127.0.0.1")}/graphql`;
    for (const [operation, op] of Object.entries(OPERATIONS) as [keyof typeof OPERATIONS, (typeof OPERATIONS)[keyof typeof OPERATIONS]][]) {
      const call = async (i: number) => {
        const response = await fetch(url, {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${engram[op.key]}` },
          body: JSON.stringify({ query: op.query, variables: op.variables(i) }),
        });
        const result = (await response.json()) as { errors?: unknown[] };
        if (!response.ok || result.errors) throw new Error(`${operation} failed: ${JSON.stringify(result)}`);
      };
      await runConcurrent(WARMUP, CONCURRENCY, call);
      const before = statements.count;
      const run = await runConcurrent(N, CONCURRENCY, (i) => call(WARMUP + i));
      rows.push({ kind: store.kind, ttlMs, operation, run, statementsPerOp: (statements.count - before) / N });
      console.log(`${store.kind} ttl ${ttlMs} ${operation}: ${fmt(run.perSecond)}/s`);
    }
  } finally {
    await app.stop();
    await engram.services.close();
  }
  return rows;
}

async function benchStore(store: BenchStore): Promise<Row[]> {
  return [...(await measureWith(store, 0)), ...(await measureWith(store, 1_000))];
}

function report(results: Row[][], skipped: string[]): string {
  const rows = results.flat().map((r) => [
    `${r.kind} · ${r.operation}`,
    r.ttlMs === 0 ? "off (0)" : `${fmt(r.ttlMs)} ms`,
    ...rateAndPercentiles(r.run),
    r.statementsPerOp.toFixed(2),
  ]);
  return [
    "## Key cache",
    "",
    `${fmt(N)} requests per row after ${fmt(WARMUP)} warm-up requests, ${CONCURRENCY} in flight, posted with \`fetch\` to the server on a loopback port with one key. ` +
      "`viewer` does nothing but the key check; `appendEvent` is the usual write. With the cache off every request looks its key up; " +
      "with the default TTL (1 s) a key is looked up about once a second per instance. SQL statements are counted at `pg.Client#query`.",
    "",
    measuredOn(skipped),
    "",
    markdownTable(["Store · operation", "key cache TTL", "requests/s", "p50", "p95", "p99", "SQL statements / request"], rows),
    "",
    "Reproduce: `npx tsx bench/key-cache/run.ts` (env `BENCH_N`, `BENCH_WARMUP`, `BENCH_CONCURRENCY`, `BENCH_STORES`, `BENCH_DATABASE_URL`).",
  ].join("\n");
}

runBenchmark("key-cache", benchStore, report);
