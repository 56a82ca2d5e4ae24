// appendEvent over real HTTP against the same rows inserted straight through the Prisma client,
// on the embedded store and on PostgreSQL. Run: npx tsx bench/append/run.ts
import pg from "pg";
import { buildApp } from "../../src/app.ts";
import { appNow } from "../../src/db.ts";
import {
  envInt,
  fmt,
  markdownTable,
  measuredOn,
  openBenchEngram,
  percentile,
  rateAndPercentiles,
  ratio,
  runBenchmark,
  runConcurrent,
  type BenchStore,
  type RunResult,
  type StoreKind,
} from "../lib.ts";

const N = envInt("BENCH_N", 2_000);
const WARMUP = envInt("BENCH_WARMUP", 200);
const CONCURRENCY = envInt("BENCH_CONCURRENCY", 8);
// One append at a time: the latency a single agent sees when nothing else is going on.
const ALONE_N = envInt("BENCH_ALONE_N", 200);

const APPEND = /* GraphQL */ `
  mutation Append($input: AppendEventInput!) {
    appendEvent(input: $input) { id }
  }
`;

// A call summary of ordinary size (~400 characters), spread over a few entities.
const BODY =
  "## Call with the customer\n\n- Asked to move the renewal to **March**; budget is confirmed.\n" +
  "- Wants weekly reports by email instead of the dashboard.\n- Next step: send the revised quote " +
  "by Friday and book a follow-up with their finance lead.\n\nTone was positive; no blockers raised " +
  "beyond the date change. Owner on our side: the account manager.";

function eventInput(index: number) {
  return {
    scope: "ENTITY" as const,
    scopeRef: `customer-${index % 25}`,
    kind: "call_summary",
    body: BODY,
    source: "bench",
  };
}

// Every SQL statement goes through pg.Client#query (the adapter's pool included): counting
// them shows how many round trips each append costs.
let statements = 0;
const clientQuery = pg.Client.prototype.query;
pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
  statements++;
  return (clientQuery as (...a: unknown[]) => unknown).apply(this, args);
} as typeof clientQuery;

type Measured = RunResult & { statementsPerOp: number; alone: RunResult };

async function measure(op: (index: number) => Promise<unknown>, offset: number): Promise<Measured> {
  const before = statements;
  const result = await runConcurrent(N, CONCURRENCY, (i) => op(offset + i));
  const statementsPerOp = (statements - before) / N;
  const alone = await runConcurrent(ALONE_N, 1, (i) => op(offset + N + i));
  return { ...result, statementsPerOp, alone };
}

type StoreResult = { kind: StoreKind; http: Measured; raw: Measured; prisma: Measured };

async function benchStore(store: BenchStore): Promise<StoreResult> {
  const started = performance.now();
  const engram = await openBenchEngram(store);
  const { services, tenantId, writerKey } = engram;
  const app = buildApp(services);
  try {
    const url = `${await app.start(0, "127.0.0.1")}/graphql`;
    const headers = { "content-type": "application/json", authorization: `Bearer ${writerKey}` };

    const overHttp = async (index: number) => {
      const response = await fetch(url, {
        method: "POST",
        headers,
        body: JSON.stringify({ query: APPEND, variables: { input: eventInput(index) } }),
      });
      const result = (await response.json()) as { data?: { appendEvent?: { id: string } }; errors?: unknown[] };
      if (!response.ok || result.errors || !result.data?.appendEvent?.id) {
        throw new Error(`appendEvent failed (HTTP ${response.status}): ${JSON.stringify(result.errors ?? result)}`);
      }
    };
    // The baseline: one INSERT statement, what appendEvent itself sends, with nothing around it.
    const raw = (index: number) => {
      const e = eventInput(index);
      return services.db.$queryRaw`
        INSERT INTO "MemoryEvent" ("id", "tenantId", "scope", "scopeRef", "kind", "body", "source", "occurredAt", "createdAt")
        VALUES (gen_random_uuid()::text, ${tenantId}, ${e.scope}::"Scope", ${e.scopeRef}, ${e.kind}, ${e.body}, ${e.source},
                ${appNow()}, ${appNow()})
        RETURNING "id"`;
    };
    // The same row through Prisma's create (its WASM query compiler first), as this bench's baseline was until 2026-12-04.
    const prisma = (index: number) =>
      services.db.memoryEvent.create({
        data: { tenantId, ...eventInput(index), sourceRef: null, occurredAt: new Date() },
        select: { id: true },
      });

    await runConcurrent(WARMUP, CONCURRENCY, overHttp);
    await runConcurrent(WARMUP, CONCURRENCY, (i) => raw(WARMUP + i));
    await runConcurrent(WARMUP, CONCURRENCY, (i) => prisma(2 * WARMUP + i));
    const rawResult = await measure(raw, 3 * WARMUP);
    const prismaResult = await measure(prisma, 3 * WARMUP + N + ALONE_N);
    const httpResult = await measure(overHttp, 3 * WARMUP + 2 * (N + ALONE_N));
    const expected = 3 * (WARMUP + N + ALONE_N);
    const rows = await services.db.memoryEvent.count({ where: { tenantId } });
    if (rows !== expected) throw new Error(`expected ${expected} events, found ${rows}`);
    console.log(
      `${store.kind}: http ${fmt(httpResult.perSecond)}/s, raw ${fmt(rawResult.perSecond)}/s, prisma ${fmt(prismaResult.perSecond)}/s ` +
        `(${((performance.now() - started) / 1000).toFixed(1)} s)`,
    );
    return { kind: store.kind, http: httpResult, raw: rawResult, prisma: prismaResult };
  } finally {
    await app.stop();
    await services.close();
  }
}

function report(results: StoreResult[], skipped: string[]): string {
  const rows: string[][] = [];
  for (const r of results) {
    for (const [path, m] of [["HTTP appendEvent", r.http], ["raw SQL insert", r.raw], ["Prisma create", r.prisma]] as const) {
      rows.push([
        `${r.kind} · ${path}`,
        ...rateAndPercentiles(m),
        fmt(percentile(m.alone.latencies, 50), " ms"),
        fmt(percentile(m.alone.latencies, 95), " ms"),
        fmt(m.statementsPerOp),
      ]);
    }
  }
  const table = markdownTable(
    ["Store · path", "events/s", "p50", "p95", "p99", "p50 alone", "p95 alone", "SQL statements / append"],
    rows,
  );

  const ratios: string[][] = results.map((r) => [
    r.kind,
    ratio(r.http.perSecond, r.raw.perSecond),
    ratio(percentile(r.http.latencies, 50), percentile(r.raw.latencies, 50)),
    ratio(r.http.perSecond, r.prisma.perSecond),
  ]);
  const ratioTable = markdownTable(
    ["Store", "HTTP / raw SQL throughput (the goal's ratio)", "HTTP / raw SQL p50 latency", "HTTP / Prisma create throughput"],
    ratios,
  );

  const embedded = results.find((r) => r.kind === "embedded");
  const postgres = results.find((r) => r.kind === "postgres");
  const storeRatio =
    embedded && postgres
      ? markdownTable(
          ["Path", "embedded / PostgreSQL throughput", "embedded / PostgreSQL p50 latency"],
          [
            ["HTTP appendEvent", ratio(embedded.http.perSecond, postgres.http.perSecond), ratio(percentile(embedded.http.latencies, 50), percentile(postgres.http.latencies, 50))],
            ["raw SQL insert", ratio(embedded.raw.perSecond, postgres.raw.perSecond), ratio(percentile(embedded.raw.latencies, 50), percentile(postgres.raw.latencies, 50))],
          ],
        )
      : "_Only one store was measured, so there is no embedded / PostgreSQL ratio._";

  return [
    "## Append",
    "",
    `${fmt(N)} appends per measurement after ${fmt(WARMUP)} warm-up appends, ${CONCURRENCY} in flight. ` +
      "**HTTP** is the `appendEvent` mutation posted with `fetch` to the server on a loopback port " +
      "(API key lookup, validation, insert, the answer from the inserted row, in-process publish with the feed's history row; appends that arrive while one of the tenant's inserts is out go together as the next statement). " +
      "**Raw SQL** is the same row inserted by one `INSERT … RETURNING` statement (`$queryRaw`) through the same Prisma client " +
      "and pool (8 connections), a plain `VALUES` insert (appendEvent's own statement carries its rows, one or many, as one JSON parameter); **Prisma create** is `services.db.memoryEvent.create` " +
      "with the same data (Prisma's WASM query compiler runs first), this bench's baseline until 2026-12-04. Latency is per append, measured at the caller while the others are " +
      `in flight, so it includes waiting for a connection; the *alone* columns are ${fmt(ALONE_N)} more ` +
      "appends made one at a time. The load generator runs in the server's " +
      "process, so HTTP numbers also pay for the client side of `fetch`. SQL statements are counted " +
      "at `pg.Client#query`.",
    "",
    measuredOn(skipped),
    "",
    table,
    "",
    ratioTable,
    "",
    storeRatio,
    "",
    "Reproduce: `npx tsx bench/append/run.ts` (env `BENCH_N`, `BENCH_WARMUP`, `BENCH_CONCURRENCY`, " +
      "`BENCH_ALONE_N`, `BENCH_STORES`, `BENCH_DATABASE_URL`).",
  ].join("\n");
}

runBenchmark("append", benchStore, report);
