// 200 concurrent clients for 60 s on each store, mixed appendEvent / recordTurn / context /
// searchEntries / recall over real HTTP, then a hot conversation (every client on one), then the
// checks: every acknowledged write stored once, seq gapless, every turn's follow-ups done.
// Run: npm run bench:soak
import os from "node:os";
import { startWorker } from "../../jobs/worker.ts";
import { buildApp } from "../../src/app.ts";
import { forTenant } from "../../src/db.ts";
import { upsertAgent } from "../../src/memory/conversations/agents.ts";
import { createEntry } from "../../src/memory/log/entries.ts";
import { modelEnv } from "../../test/helpers/engram.ts";
import { scriptFaultyModel } from "../../test/helpers/faulty-model.ts";
import { startModelServer } from "../../test/helpers/model-server.ts";
import {
  latencyOf,
  startWriteLoad,
  untilFollowUpsDone,
  verifyAcknowledged,
  type Operation,
  type WriteLoad,
} from "../../test/helpers/write-load.ts";
import { envInt, fmt, markdownTable, measuredOn, openBenchEngram, runBenchmark, type BenchStore, type StoreKind } from "../lib.ts";

const CLIENTS = envInt("BENCH_SOAK_CLIENTS", 200);
const SECONDS = envInt("BENCH_SOAK_SECONDS", 60);
const HOT_SECONDS = envInt("BENCH_SOAK_HOT_SECONDS", 20);
const TIMEOUT_MS = 30_000;
// How long the follow-ups may take to catch up after the load before the run counts as failed.
const CATCH_UP_MS = envInt("BENCH_SOAK_CATCH_UP_SECONDS", 900) * 1_000;
const REDIS_URL = process.env.BENCH_REDIS_URL ?? "redis://127.0.0.1:6379";

const OPERATIONS: Operation[] = ["recordTurn", "appendEvent", "context", "searchEntries", "recall"];
// What agents and their tools do most: read context before a reply, record the turn after it.
const MIX: Record<Operation, number> = { recordTurn: 3, appendEvent: 2, context: 3, searchEntries: 1, recall: 1 };

type Phase = { name: string; conversations: number; seconds: number; load: WriteLoad; elapsedMs: number; loadAverage: number };
type StoreResult = {
  kind: StoreKind;
  phases: Phase[];
  problems: string[];
  acknowledged: { turns: number; events: number };
  catchUpMs: number | null;
  catchUpError?: string;
};

async function soak(url: string, key: string, name: string, conversations: number, seconds: number): Promise<Phase> {
  const started = performance.now();
  const load = startWriteLoad({ url, key, clients: CLIENTS, conversations, tag: name, mix: MIX, timeoutMs: TIMEOUT_MS, retries: 0 });
  await new Promise((resolve) => setTimeout(resolve, seconds * 1_000));
  await load.stop();
  return { name, conversations, seconds, load, elapsedMs: performance.now() - started, loadAverage: os.loadavg()[0] };
}

async function benchStore(store: BenchStore): Promise<StoreResult> {
  const model = await startModelServer();
  scriptFaultyModel(model);
  const engram = await openBenchEngram(store, {
    ...modelEnv(model),
    ENGRAM_EMBEDDINGS: "openai",
    ENGRAM_JOB_POLL_MS: "200",
    ...(store.kind === "postgres" ? { REDIS_URL } : {}),
  });
  const { services, tenantId, writerKey } = engram;
  const worker = await startWorker(services);
  const app = buildApp(services);
  try {
    const url = await app.start(0, "127.0.0.1");
    const db = forTenant(services.db, tenantId);
    for (let i = 0; i < 40; i++) {
      await createEntry(db, services.deps, {
        scope: "ENTITY",
        scopeRef: `customer-${i % 20}`,
        title: `Renewal plan ${i}`,
        summary: `The renewal moves to March; weekly reports by email (${i}).`,
        tags: ["renewal"],
        importance: 3,
        source: "MANUAL",
      });
    }
    for (const tag of ["soak", "hot"]) await upsertAgent(db, { externalId: `${tag}-agent`, settings: { quietExtractionSeconds: 5 } });

    console.log(`${store.kind}: ${CLIENTS} clients over ${CLIENTS} conversations for ${SECONDS} s…`);
    const spread = await soak(url, writerKey, "soak", CLIENTS, SECONDS);
    console.log(`${store.kind}: ${CLIENTS} clients on one conversation for ${HOT_SECONDS} s…`);
    const hot = await soak(url, writerKey, "hot", 1, HOT_SECONDS);
    const acked = {
      turns: [...spread.load.acked.turns, ...hot.load.acked.turns],
      events: [...spread.load.acked.events, ...hot.load.acked.events],
    };
    const problems = await verifyAcknowledged(services.store.url, tenantId, acked);
    const catchUpStarted = performance.now();
    let catchUpMs: number | null = null;
    let catchUpError: string | undefined;
    try {
      await untilFollowUpsDone(services.store.url, tenantId, CATCH_UP_MS);
      catchUpMs = performance.now() - catchUpStarted;
    } catch (error) {
      catchUpError = (error as Error).message;
    }
    return { kind: store.kind, phases: [spread, hot], problems, acknowledged: { turns: acked.turns.length, events: acked.events.length }, catchUpMs, catchUpError };
  } finally {
    await app.stop();
    await worker.stop();
    await services.close();
    await model.stop();
  }
}

const storeName = (kind: StoreKind) => (kind === "embedded" ? "embedded" : "PostgreSQL + Redis");

function report(results: StoreResult[], skipped: string[]): string {
  const rows: string[][] = [];
  for (const result of results) {
    for (const phase of result.phases) {
      const label = phase.conversations === 1 ? "hot: 1 conversation" : `${phase.conversations} conversations`;
      for (const op of OPERATIONS) {
        const stats = phase.load.stats[op];
        const { p50, p95, p99 } = latencyOf(stats);
        rows.push([
          `${storeName(result.kind)}, ${label}`,
          op,
          String(stats.count),
          fmt((stats.count * 1000) / phase.elapsedMs),
          String(stats.errors),
          String(stats.timeouts),
          fmt(p50, " ms"),
          fmt(p95, " ms"),
          fmt(p99, " ms"),
        ]);
      }
    }
  }
  const failures = results.flatMap((r) => r.phases.flatMap((p) => OPERATIONS.map((op) => p.load.stats[op].errors + p.load.stats[op].timeouts))).reduce((a, b) => a + b, 0);
  const checks = results.map((r) => {
    const total = r.phases.reduce((sum, p) => sum + OPERATIONS.reduce((n, op) => n + p.load.stats[op].count, 0) / (p.elapsedMs / 1000), 0);
    const samples = r.phases.flatMap((p) => OPERATIONS.flatMap((op) => p.load.stats[op].errorSamples.map((s) => `${op}: ${s}`))).slice(0, 3);
    return (
      `- **${storeName(r.kind)}**: ${r.acknowledged.turns} turns and ${r.acknowledged.events} events acknowledged; ` +
      (r.problems.length ? `**${r.problems.length} problems** (${r.problems.slice(0, 3).join("; ")})` : "every one stored exactly once, seq gapless in every conversation") +
      "; " +
      (r.catchUpMs !== null
        ? `every turn's follow-ups (snippets indexed, summary caught up, extraction done) finished ${fmt(r.catchUpMs / 1000, " s")} after the load stopped`
        : `**follow-ups not done** after ${CATCH_UP_MS / 1000} s (${r.catchUpError})`) +
      `. Load average at the end of each phase: ${r.phases.map((p) => p.loadAverage.toFixed(1)).join(" and ")}; ` +
      `${fmt(total / r.phases.length)} requests/s on average.` +
      (samples.length ? ` First errors: ${samples.join("; ")}.` : "")
    );
  });
  const verified = results.every((r) => r.problems.length === 0 && r.catchUpMs !== null);
  return `## Soak

${CLIENTS} concurrent clients on 127.0.0.1 for ${SECONDS} s over ${CLIENTS} conversations (each client an agent on its own
conversation, a few per end user), then ${HOT_SECONDS} s with every client on one hot conversation, on each store
(PostgreSQL with Redis for subscriptions). Each client loops over a mix of recordTurn 3 : context 3 : appendEvent 2 :
searchEntries 1 : recall 1 through the API with a writer key, and a request unanswered after 30 s counts as a timeout.
The worker runs every turn's follow-ups meanwhile against a scripted OpenAI-compatible model on loopback (summaries,
gate, extraction, embeddings). After the load: every acknowledged write must be stored exactly once, seq gapless, and
every turn's follow-ups done. The load generator runs in the server's process, so it shares the event loop and the CPU.
Run: \`npm run bench:soak\` (\`BENCH_SOAK_CLIENTS\`, \`BENCH_SOAK_SECONDS\`, \`BENCH_SOAK_HOT_SECONDS\`, \`BENCH_STORES\`).

${markdownTable(["store, conversations", "operation", "requests", "per s", "errors", "timeouts (30 s)", "p50", "p95", "p99"], rows)}

${checks.join("\n")}

Goal: 0 errors and 0 client timeouts at 30 s — **${failures === 0 ? "met" : `not met (${failures} failed requests)`}**; every
acknowledged write present once with its follow-ups — **${verified ? "met" : "not met"}**. Turns of one conversation
serialize on its row lock, so the hot conversation's recordTurn latency is the queue of its turns, not the store's speed.

${measuredOn(skipped)}`;
}

runBenchmark("soak", benchStore, report);
