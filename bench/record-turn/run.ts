// recordTurn over real HTTP, one call at a time as the peers harness drives it, against the same
// messages and turn inserted straight through the Prisma client, on the embedded store and on
// PostgreSQL; with the job worker off (the request alone) and on (the request while the worker
// derives snippets, embeds them and runs the gate against a scripted model on loopback, as in the
// harness). Run: npx tsx bench/record-turn/run.ts
import { buildApp } from "../../src/app.ts";
import { startWorker } from "../../jobs/worker.ts";
import { startModelServer, type ModelServer } from "../../test/helpers/model-server.ts";
import { factsScript, memoryScript } from "../../test/helpers/scripted-memory-model.ts";
import {
  envInt,
  rssLine,
  sampleTreeRss,
  type TreeRss,
  fmt,
  markdownTable,
  measuredOn,
  openBenchEngram,
  percentile,
  rateAndPercentiles,
  ratio,
  runBenchmark,
  runConcurrent,
  sqlStatementCounter,
  type BenchStore,
  type RunResult,
  type StoreKind,
} from "../lib.ts";

const N = envInt("BENCH_N", 1_000);
const WARMUP = envInt("BENCH_WARMUP", 100);
const CONCURRENCY = envInt("BENCH_CONCURRENCY", 1);
// LoCoMo-like: a few users, sessions of about 20 turns each.
const USERS = envInt("BENCH_USERS", 10);
const SESSION_TURNS = envInt("BENCH_SESSION_TURNS", 20);
// "harness": summary and extraction off, as the peers harness sets its agent; "default": the agent
// at its default settings (summary and extraction on), the model's answers scripted by chain.
const AGENT = process.env.BENCH_AGENT === "default" ? "default" : "harness";
const DIM = 512;

const RECORD = /* GraphQL */ `
  mutation($input: RecordTurnInput!) {
    recordTurn(input: $input) { firstSeq lastSeq conversation { id endUser { id } } }
  }
`;

const USER_TEXT = "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.";
const REPLY_TEXT = "Melanie: Wow, that's cool, Caroline! What happened that was so awesome? Did you hear any inspiring stories?";

function turnInput(run: string, index: number) {
  const session = Math.floor(index / SESSION_TURNS);
  const user = session % USERS;
  return {
    agentExternalId: "bench",
    endUserExternalId: `user-${user}`,
    conversationExternalId: `${run}-s${session}`,
    clientTurnId: `${run}-${index}`,
    userMessage: `${USER_TEXT} (${index})`,
    assistantMessage: `${REPLY_TEXT} (${index})`,
  };
}

/** A deterministic unit vector per text, so the worker's embeddings cost the mock next to nothing. */
function vectorOf(text: string): number[] {
  let h = 2166136261;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619);
  const v = Array.from({ length: DIM }, (_, i) => Math.sin(h + i * 7.13));
  const norm = Math.hypot(...v);
  return v.map((x) => x / norm);
}

const sql = sqlStatementCounter();

type Measured = RunResult & { statementsPerOp: number };

async function measure(run: (count: number, op: (i: number) => Promise<unknown>) => Promise<RunResult>, op: (i: number) => Promise<unknown>) {
  const before = sql.count;
  const result = await run(N, op);
  return { ...result, statementsPerOp: (sql.count - before) / N } satisfies Measured;
}

type StoreResult = { kind: StoreKind; raw: Measured; httpJobsOff: Measured; httpJobsOn: Measured; modelCalls: number; peak: TreeRss };

async function benchStore(store: BenchStore): Promise<StoreResult> {
  const started = performance.now();
  const model: ModelServer = await startModelServer();
  model.embed((input) => input.map(vectorOf));
  // The gate's verdict: nothing to remember, nothing to forget (what most LoCoMo turns get); with
  // the default agent, a gate that remembers one turn in four, one fact per remembered turn, and
  // summaries with their judges.
  model.respond(
    AGENT === "default"
      ? factsScript(
          {
            triage: (message) => ({ remember: message.length % 4 === 0 }),
            extract: (messages) => messages.filter((m) => m.role === "user").slice(0, 1).map((m) => ({ text: `The user said: ${m.content.slice(0, 80)}`, seq: m.seq })),
          },
          memoryScript(),
        )
      : () => JSON.stringify({ remember: false, forget: "NONE", forgetTargets: [], needsRecall: false }),
  );
  const engram = await openBenchEngram(store, {
    OPENAI_BASE_URL: `${model.url}/v1`,
    OPENAI_API_KEY: "bench",
    ENGRAM_EMBEDDINGS: "openai",
    ENGRAM_JOB_POLL_MS: "500",
  });
  const { services, tenantId, writerKey } = engram;
  const app = buildApp(services);
  const sequential = (count: number, op: (i: number) => Promise<unknown>) => runConcurrent(count, CONCURRENCY, op);
  try {
    const url = `${await app.start(0, "127.0.0.1")}/graphql`;
    const headers = { "content-type": "application/json", authorization: `Bearer ${writerKey}` };
    await services.db.agent.create({ data: { tenantId, externalId: "bench", name: "bench", settings: AGENT === "default" ? {} : { summaryOn: false, extractionOn: false } } }).catch(() => {});
    const overHttp = (run: string) => async (index: number) => {
      const response = await fetch(url, { method: "POST", headers, body: JSON.stringify({ query: RECORD, variables: { input: turnInput(run, index) } }) });
      const result = (await response.json()) as { data?: { recordTurn?: { firstSeq: number } }; errors?: unknown[] };
      if (!response.ok || result.errors || !result.data?.recordTurn) {
        throw new Error(`recordTurn failed (HTTP ${response.status}): ${JSON.stringify(result.errors ?? result)}`);
      }
    };

    // Raw: the rows a recorded turn writes, through the same client: bump lastSeq, two messages, the turn.
    const rawConversations = new Map<number, string>();
    const raw = async (index: number) => {
      const input = turnInput("raw", index);
      const session = Math.floor(index / SESSION_TURNS);
      let conversationId = rawConversations.get(session);
      if (!conversationId) {
        const agent = await services.db.agent.upsert({ where: { tenantId_externalId: { tenantId, externalId: "bench" } }, create: { tenantId, externalId: "bench", name: "bench" }, update: {} });
        const endUser = await services.db.endUser.upsert({ where: { tenantId_externalId: { tenantId, externalId: input.endUserExternalId } }, create: { tenantId, externalId: input.endUserExternalId }, update: {} });
        conversationId = (await services.db.conversation.create({ data: { tenantId, externalId: input.conversationExternalId, agentId: agent.id, endUserId: endUser.id } })).id;
        rawConversations.set(session, conversationId);
      }
      const occurredAt = new Date();
      const { lastSeq } = await services.db.conversation.update({ where: { id: conversationId }, data: { lastSeq: { increment: 2 } }, select: { lastSeq: true } });
      await services.db.message.createMany({
        data: [
          { tenantId, conversationId, seq: lastSeq - 1, role: "USER", content: input.userMessage, occurredAt },
          { tenantId, conversationId, seq: lastSeq, role: "ASSISTANT", content: input.assistantMessage, occurredAt },
        ],
      });
      await services.db.turn.create({ data: { tenantId, conversationId, clientTurnId: input.clientTurnId, firstSeq: lastSeq - 1, lastSeq, occurredAt } });
    };

    await sequential(WARMUP, overHttp("warm-off"));
    await sequential(WARMUP, raw);
    const rawResult = await measure(sequential, (i) => raw(WARMUP + i));
    const httpJobsOff = await measure(sequential, overHttp("off"));
    // The worker drains the turns recorded so far before the measured run starts.
    const worker = await startWorker(services);
    try {
      // BENCH_DRAIN=1 (default agent): how long the worker takes to gate what the rows before left.
      if (process.env.BENCH_DRAIN && AGENT === "default") {
        const turns = await services.db.turn.count({ where: { tenantId } });
        const started = performance.now();
        for (;;) {
          const judged = await services.db.turn.count({ where: { tenantId, gatedAt: { not: null } } });
          if (judged >= turns) break;
          if (performance.now() - started > 600_000) throw new Error(`drain: ${turns - judged} of ${turns} turns still unjudged after 10 minutes`);
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
        const seconds = (performance.now() - started) / 1000;
        console.log(`drain: ${turns} turns gated in ${seconds.toFixed(1)} s (${(turns / seconds).toFixed(1)} turns/s)`);
      }
      await sequential(WARMUP, overHttp("warm-on"));
      const callsBefore = model.requests.length + model.embeddingRequests.length;
      const sampler = sampleTreeRss();
      let httpJobsOn!: Measured;
      const statements = await sql.record(async () => {
        httpJobsOn = await measure(sequential, overHttp("on")).finally(() => sampler.stop());
      });
      const peak = sampler.peak();
      // BENCH_SQL_PROFILE=1: the worker-on row's statements by kind, most frequent first.
      if (process.env.BENCH_SQL_PROFILE) {
        const kinds = new Map<string, number>();
        for (const text of statements) {
          const kind = text.replace(/\s+/g, " ").replace(/\$\d+/g, "$").slice(0, 110);
          kinds.set(kind, (kinds.get(kind) ?? 0) + 1);
        }
        for (const [kind, count] of [...kinds].sort((a, b) => b[1] - a[1]).slice(0, 40)) console.log(`${(count / N).toFixed(2)}/turn  ${kind}`);
      }
      const modelCalls = model.requests.length + model.embeddingRequests.length - callsBefore;
      console.log(
        `${store.kind}: raw ${fmt(rawResult.perSecond)}/s, http jobs off ${fmt(httpJobsOff.perSecond)}/s, ` +
          `jobs on ${fmt(httpJobsOn.perSecond)}/s (${((performance.now() - started) / 1000).toFixed(1)} s)`,
      );
      return { kind: store.kind, raw: rawResult, httpJobsOff, httpJobsOn, modelCalls, peak };
    } finally {
      await worker.stop(5_000);
    }
  } finally {
    await app.stop();
    await services.close();
    await model.stop();
  }
}

function report(results: StoreResult[], skipped: string[]): string {
  const rows: string[][] = [];
  for (const r of results) {
    for (const [path, m] of [
      ["raw Prisma (update, createMany, create)", r.raw],
      ["HTTP recordTurn, job worker off", r.httpJobsOff],
      ["HTTP recordTurn, job worker on", r.httpJobsOn],
    ] as const) {
      rows.push([`${r.kind} · ${path}`, ...rateAndPercentiles(m), fmt(m.statementsPerOp)]);
    }
  }
  const table = markdownTable(["Store · path", "turns/s", "p50", "p95", "p99", "SQL statements / turn (incl. worker)"], rows);
  const ratios = markdownTable(
    ["Store", "HTTP (worker off) / raw", "HTTP (worker on) / raw", "goal ≥ 130 turns/s, p95 ≤ 15 ms (worker on)"],
    results.map((r) => [
      r.kind,
      ratio(r.httpJobsOff.perSecond, r.raw.perSecond),
      ratio(r.httpJobsOn.perSecond, r.raw.perSecond),
      r.httpJobsOn.perSecond >= 130 && percentile(r.httpJobsOn.latencies, 95) <= 15 ? "met" : "**not met**",
    ]),
  );
  return [
    "## recordTurn",
    "",
    `${fmt(N)} turns per row after ${fmt(WARMUP)} warm-up turns, ${CONCURRENCY} in flight (the peers harness calls ` +
      `one at a time), each a user message and a reply (~100 characters each), ${USERS} end users, a new ` +
      `conversation every ${SESSION_TURNS} turns (LoCoMo's sessions). **HTTP** is the \`recordTurn\` mutation ` +
      "posted with `fetch` to the server on a loopback port, selecting what the harness selects " +
      "(`firstSeq lastSeq conversation { id endUser { id } }`). **Raw** writes the same rows through the same " +
      "Prisma client (bump `lastSeq`, `createMany` the two messages, create the turn; no transaction). " +
      "*Worker on* runs the job worker in the same process while measuring, as `npm start` does: the " +
      "turns' follow-ups derive their snippets and embed them through a scripted OpenAI-compatible server on " +
      "loopback (512-d), " +
      (AGENT === "default"
        ? "and the agent has its default settings (`BENCH_AGENT=default`: summary and extraction on), so each " +
          "turn's gate, extraction and fact judge and each conversation's summary rewrites call the scripted model "
        : "with the agent's summary and extraction off, as the harness sets it ") +
      "(the worker-on rows also drain what the worker-off rows left). SQL statements are counted at " +
      "`pg.Client#query` over the whole row, so the worker-on rows include the worker's statements.",
    "",
    measuredOn(skipped),
    "",
    table,
    "",
    ratios,
    "",
    `Peak resident memory of the process tree during the worker-on rows (sampled every 250 ms from /proc): ${results
      .map((r) => `${r.kind} ${rssLine(r.peak)}`)
      .join("; ")}. The embedded row has no Chroma child until the first upsert starts it.`,
    "",
    `Chat and embedding calls to the scripted model during the worker-on rows: ${results.map((r) => `${r.kind} ${fmt(r.modelCalls)}`).join(", ")}.`,
    "",
    "Reproduce: `npx tsx bench/record-turn/run.ts` (env `BENCH_N`, `BENCH_WARMUP`, `BENCH_CONCURRENCY`, " +
      "`BENCH_USERS`, `BENCH_SESSION_TURNS`, `BENCH_STORES`, `BENCH_DATABASE_URL`).",
  ].join("\n");
}

runBenchmark("record-turn", benchStore, report);
