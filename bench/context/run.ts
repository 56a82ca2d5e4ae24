// Latency of the `context` query over a store holding 1,000 conversations of 200 messages, on the
// embedded store and on PostgreSQL. Run: npx tsx bench/context/run.ts
//
// Seeding goes straight through Prisma's createMany (the API would take far too long for 200k
// messages); the queries go through the whole GraphQL path in process (yoga.fetch with a reader
// key: key lookup, parsing, validation, cost limits, assembleContext, serialisation).
import { randomUUID } from "node:crypto";
import os from "node:os";
import { buildApp } from "../../src/app.ts";
import { forTenant, type Db } from "../../src/db.ts";
import { assembleContext } from "../../src/memory/context.ts";
import { countTokens } from "../../src/memory/tokens.ts";
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
  sqlStatementCounter,
  type BenchStore,
  type RunResult,
  type StoreKind,
} from "../lib.ts";

const CONVERSATIONS = envInt("BENCH_CONVERSATIONS", 1_000);
const MESSAGES = envInt("BENCH_MESSAGES", 200);
const QUERIES = envInt("BENCH_QUERIES", 500);
const WARMUP = envInt("BENCH_WARMUP", 50);
const CONCURRENCY = envInt("BENCH_CONCURRENCY", 8);
const BATCH = envInt("BENCH_BATCH", 4_000); // messages per createMany
const AGENTS = 4;
const END_USERS = Math.max(1, Math.ceil(CONVERSATIONS / 4));
// Everything up to lastSeq − 6 is folded into the summary (194 of 200), as after a rewrite.
const SUMMARY_THROUGH = Math.max(0, MESSAGES - 6);
// Older messages the verbatim judge scored 2 (useful) or 3 (essential) in each conversation.
const KEPT_PER_CONVERSATION = 3;
const ENTRIES_PER_END_USER = 4;
const ENTRIES_PER_AGENT = 25;
const INSTITUTIONAL_ENTRIES = 200;

const statements = sqlStatementCounter();

// --- Deterministic, support-desk-like text ------------------------------------------------------

function rng(seed: number) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const random = rng(42);
const pick = <T>(items: readonly T[]) => items[Math.floor(random() * items.length)];
const int = (max: number) => Math.floor(random() * max);

const TOPICS = [
  "invoice", "refund", "renewal", "password", "shipment", "subscription", "discount", "warranty",
  "integration", "dashboard", "export", "migration", "contract", "onboarding", "outage", "latency",
  "billing address", "payment method", "API key", "single sign-on", "data retention", "report",
  "delivery date", "upgrade", "downgrade", "trial", "quota", "webhook", "backup", "audit log",
] as const;
const USER_OPENERS = [
  "Hi, I have a question about the", "Can you check what happened with the", "We still have a problem with the",
  "Quick follow-up on the", "I was told last week that the", "Could you explain how the",
  "My manager asked me to confirm the", "Is there a way to change the", "Why did the",
] as const;
const USER_MIDDLES = [
  "for our team in Berlin", "on the enterprise plan", "since the update on Monday", "for the March cycle",
  "that we discussed with your colleague", "for account 4471", "before the end of the quarter",
  "for the new project", "after we moved to the annual plan",
] as const;
const USER_ENDINGS = [
  "It is blocking our finance people.", "Nobody on our side can find it.", "We need an answer by Friday.",
  "Please let me know what you need from me.", "This has happened twice already.", "Thanks in advance!",
  "The numbers do not match what we expected.", "I attached nothing, it is all in the portal.",
] as const;
const ASSISTANT_OPENERS = [
  "Thanks for the details. I looked into the", "I understand. Here is what I found about the",
  "Good question. The", "I checked your account and the", "Sorry for the trouble with the",
  "Let me summarise where we are with the",
] as const;
const ASSISTANT_MIDDLES = [
  "is scheduled to be processed within two business days", "was updated by your administrator yesterday",
  "depends on the settings in the admin console under Billing", "needs a confirmation from the account owner",
  "has been escalated to our second-line team with high priority", "can be changed from the settings page at any time",
  "was applied to the next invoice rather than the current one", "is covered by the terms of your current contract",
] as const;
const ASSISTANT_ENDINGS = [
  "I will keep this ticket open until you confirm it works.", "You should receive an email with the details shortly.",
  "If anything is still unclear, just reply here and I will follow up.", "I also added a note so the next agent has the context.",
  "Let me know whether you want me to apply the same change to the other workspaces.",
] as const;

function userMessage(): string {
  const topic = pick(TOPICS);
  return `${pick(USER_OPENERS)} ${topic} ${pick(USER_MIDDLES)}? ${pick(USER_ENDINGS)}` +
    (random() < 0.4 ? ` Also, what about the ${pick(TOPICS)}?` : "");
}

function assistantMessage(): string {
  const topic = pick(TOPICS);
  return `${pick(ASSISTANT_OPENERS)} ${topic}: it ${pick(ASSISTANT_MIDDLES)}. ${pick(ASSISTANT_ENDINGS)}` +
    (random() < 0.5 ? ` Regarding the ${pick(TOPICS)}, it ${pick(ASSISTANT_MIDDLES)}.` : "");
}

/** A rolling summary of about 150 words, like the summarizer's. */
function summaryText(endUser: number): string {
  const sentences = [
    `The user works for customer ${endUser} on the enterprise plan and mostly writes about the ${pick(TOPICS)} and the ${pick(TOPICS)}.`,
    `Earlier they reported that the ${pick(TOPICS)} ${pick(ASSISTANT_MIDDLES)}, which the agent confirmed after checking the account.`,
    `They asked twice about the ${pick(TOPICS)} ${pick(USER_MIDDLES)} and were told it ${pick(ASSISTANT_MIDDLES)}.`,
    `The agent promised to follow up on the ${pick(TOPICS)} and noted that the ${pick(TOPICS)} ${pick(ASSISTANT_MIDDLES)}.`,
    `Open questions: the ${pick(TOPICS)} ${pick(USER_MIDDLES)}, and whether the ${pick(TOPICS)} can be moved ${pick(USER_MIDDLES)}.`,
    `The user prefers short answers by email, is in the Europe/Berlin time zone, and their finance lead approves any change to the ${pick(TOPICS)}.`,
    `Tone has been friendly but impatient; nothing was escalated beyond the second-line team so far.`,
  ];
  return sentences.join(" ");
}

// --- Seeding ------------------------------------------------------------------------------------

type Seeded = {
  conversations: { id: string; endUser: number }[];
  messages: number;
  wordsPerMessage: number;
  entries: number;
  seconds: number;
};

async function seed(db: Db, tenantId: string): Promise<Seeded> {
  const started = performance.now();
  const agents = Array.from({ length: AGENTS }, (_, i) => ({ id: randomUUID(), tenantId, externalId: `agent-${i}`, name: `Agent ${i}` }));
  const endUsers = Array.from({ length: END_USERS }, (_, i) => ({ id: randomUUID(), tenantId, externalId: `customer-${i}` }));
  await db.agent.createMany({ data: agents });
  await db.endUser.createMany({ data: endUsers });

  const conversations = Array.from({ length: CONVERSATIONS }, (_, i) => ({
    id: randomUUID(),
    tenantId,
    externalId: `conversation-${i}`,
    agentId: agents[i % AGENTS].id,
    endUserId: endUsers[i % END_USERS].id,
    lastSeq: MESSAGES,
    summary: summaryText(i % END_USERS),
    summaryThroughSeq: SUMMARY_THROUGH,
  }));
  for (let i = 0; i < conversations.length; i += 1_000) {
    await db.conversation.createMany({ data: conversations.slice(i, i + 1_000) });
  }

  // Messages, generated batch by batch and written a few batches at a time.
  const base = Date.now() - MESSAGES * CONVERSATIONS * 1_000;
  let produced = 0;
  const total = CONVERSATIONS * MESSAGES;
  // A few older messages the verbatim judge wants kept; the rest of its window scored 0–1.
  const keptSeqs = new Set(Array.from({ length: KEPT_PER_CONVERSATION }, (_, k) => Math.max(1, SUMMARY_THROUGH - 3 - k * 37)));
  let words = 0;
  const nextBatch = () => {
    const rows = [];
    for (; produced < total && rows.length < BATCH; produced++) {
      const c = Math.floor(produced / MESSAGES);
      const seq = (produced % MESSAGES) + 1;
      const user = seq % 2 === 1;
      const keepScore = keptSeqs.has(seq) ? 2 + (seq % 2) : seq > SUMMARY_THROUGH - 30 && seq <= SUMMARY_THROUGH ? seq % 2 : null;
      const content = user ? userMessage() : assistantMessage();
      words += content.split(/\s+/).length;
      rows.push({
        id: randomUUID(),
        tenantId,
        conversationId: conversations[c].id,
        seq,
        role: user ? ("USER" as const) : ("ASSISTANT" as const),
        content,
        keepScore,
        occurredAt: new Date(base + produced * 1_000),
      });
    }
    return rows;
  };
  const writers = Array.from({ length: 3 }, async () => {
    for (let rows = nextBatch(); rows.length; rows = nextBatch()) await db.message.createMany({ data: rows });
  });
  await Promise.all(writers);

  // Curated entries in every scope context assembly looks at: the end user's, the agent's and
  // the institution's.
  const entries = [];
  const entry = (scope: "ENTITY" | "PROJECT" | "INSTITUTIONAL", scopeRef: string) => {
    const topic = pick(TOPICS);
    return {
      tenantId,
      scope,
      scopeRef,
      title: `${topic[0].toUpperCase()}${topic.slice(1)}: ${pick(USER_MIDDLES)}`,
      summary: `The ${topic} ${pick(ASSISTANT_MIDDLES)}; the ${pick(TOPICS)} ${pick(ASSISTANT_MIDDLES)}. ${pick(ASSISTANT_ENDINGS)}`,
      tags: [topic.replace(/\s+/g, "-"), pick(["billing", "support", "product", "legal"])],
      importance: 1 + int(5),
      source: "COMPACTOR" as const,
    };
  };
  for (const endUser of endUsers) for (let i = 0; i < ENTRIES_PER_END_USER; i++) entries.push(entry("ENTITY", endUser.externalId));
  for (const agent of agents) for (let i = 0; i < ENTRIES_PER_AGENT; i++) entries.push(entry("PROJECT", agent.externalId));
  for (let i = 0; i < INSTITUTIONAL_ENTRIES; i++) entries.push(entry("INSTITUTIONAL", "acme"));
  await db.memoryEntry.createMany({ data: entries });

  // Planner statistics, as a long-running database has them after autovacuum.
  await db.$executeRawUnsafe("ANALYZE");
  return {
    conversations: conversations.map((c, i) => ({ id: c.id, endUser: i % END_USERS })),
    messages: total,
    wordsPerMessage: words / total,
    entries: entries.length,
    seconds: (performance.now() - started) / 1000,
  };
}

// --- Measuring ----------------------------------------------------------------------------------

const CONTEXT = /* GraphQL */ `
  query Context($input: ContextInput!) {
    context(input: $input) {
      totalTokens
      baselineTokens
      savedTokens
      blocks { kind title text tokens items { id text seq role score tokens } }
    }
  }
`;

type ContextAnswer = {
  data?: {
    context?: {
      totalTokens: number;
      baselineTokens: number;
      blocks: { kind: string; text: string; items: { text: string }[] }[];
    };
  };
  errors?: unknown[];
};

type StoreResult = {
  kind: StoreKind;
  seeded: Seeded;
  alone: RunResult;
  direct: RunResult;
  loaded: RunResult;
  statementsPerQuery: number;
  sqlMsPerQuery: number;
  tokenizeMsPerQuery: number;
  statementLog: string[];
  shape: { totalTokens: number; baselineTokens: number; withEntries: number; withKept: number; blocks: number };
};

async function benchStore(store: BenchStore): Promise<StoreResult> {
  const { services, tenantId, readerKey } = await openBenchEngram(store);
  const app = buildApp(services);
  try {
    const seeded = await seed(services.db, tenantId);
    console.log(
      `${store.kind}: seeded ${fmt(seeded.messages)} messages in ${fmt(CONVERSATIONS)} conversations and ` +
        `${fmt(seeded.entries)} entries in ${seeded.seconds.toFixed(1)} s`,
    );

    const shape = { totalTokens: 0, baselineTokens: 0, withEntries: 0, withKept: 0, blocks: 0, count: 0 };
    const sampleTexts: string[][] = [];
    const randomConversation = () => seeded.conversations[Math.floor(random() * seeded.conversations.length)];
    const query = async (index: number) => {
      const conversation = randomConversation();
      const response = await app.yoga.fetch("http://engram.bench/graphql", {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${readerKey}` },
        body: JSON.stringify({ query: CONTEXT, variables: { input: { conversationId: conversation.id, message: userMessage() } } }),
      });
      const answer = (await response.json()) as ContextAnswer;
      const context = answer.data?.context;
      if (!response.ok || answer.errors || !context) {
        throw new Error(`context failed (HTTP ${response.status}): ${JSON.stringify(answer.errors ?? answer)}`);
      }
      if (index >= 0) {
        shape.count++;
        shape.totalTokens += context.totalTokens;
        shape.baselineTokens += context.baselineTokens;
        shape.blocks += context.blocks.length;
        if (context.blocks.some((b) => b.kind === "ENTRIES")) shape.withEntries++;
        if (context.blocks.some((b) => b.kind === "KEPT")) shape.withKept++;
        if (sampleTexts.length < 50) sampleTexts.push(context.blocks.flatMap((b) => [b.text, ...b.items.map((i) => i.text)]));
      }
    };
    // The same work without GraphQL: assembleContext on the tenant's client, as the resolver calls it.
    const tenantDb = forTenant(services.db, tenantId);
    const direct = () => assembleContext(tenantDb, { conversationId: randomConversation().id, message: userMessage() });

    await runConcurrent(WARMUP, 1, () => query(-1));
    const statementLog = await statements.record(() => query(-1));
    const before = { count: statements.count, ms: statements.elapsedMs };
    const alone = await runConcurrent(QUERIES, 1, query);
    const statementsPerQuery = (statements.count - before.count) / QUERIES;
    const sqlMsPerQuery = (statements.elapsedMs - before.ms) / QUERIES;
    const directRun = await runConcurrent(QUERIES, 1, direct);
    const loaded = await runConcurrent(QUERIES, CONCURRENCY, query);
    // countTokens over the texts one answer carries (each block and each item, as assembleContext
    // counts them; its count of the 20-message baseline comes on top).
    const t0 = performance.now();
    for (const texts of sampleTexts) for (const text of texts) countTokens(text);
    const tokenizeMsPerQuery = (performance.now() - t0) / sampleTexts.length;
    console.log(
      `${store.kind}: one at a time p50 ${fmt(percentile(alone.latencies, 50), " ms")}, ` +
        `${CONCURRENCY} in flight ${fmt(loaded.perSecond)}/s, ${fmt(statementsPerQuery)} statements/query`,
    );
    const n = shape.count;
    return {
      kind: store.kind,
      seeded,
      alone,
      direct: directRun,
      loaded,
      statementsPerQuery,
      sqlMsPerQuery,
      tokenizeMsPerQuery,
      statementLog,
      shape: {
        totalTokens: shape.totalTokens / n,
        baselineTokens: shape.baselineTokens / n,
        withEntries: shape.withEntries / n,
        withKept: shape.withKept / n,
        blocks: shape.blocks / n,
      },
    };
  } finally {
    await app.yoga.dispose();
    await services.close();
  }
}

const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;

/** A statement shortened to what it does: its verb and table, or the raw query's first words. */
function describe(sql: string): string {
  const flat = sql.replace(/\s+/g, " ").trim();
  const table = /\b(?:FROM|INTO|UPDATE)\s+("?[\w]+"?\.)?"?(\w+)"?/i.exec(flat)?.[2];
  const verb = flat.split(" ")[0].toUpperCase();
  if (/^WITH q AS/i.test(flat)) return "full-text search of MemoryEntry, the rows themselves (relevantEntries, raw SQL)";
  if (/^\(SELECT .* FROM "Message" .* UNION ALL/i.test(flat)) return "SELECT Message: the newest and the KEPT block's candidates, one UNION ALL (raw SQL)";
  return table ? `${verb} ${table}` : flat.slice(0, 60);
}

function report(results: StoreResult[], skipped: string[]): string {
  const rows: string[][] = [];
  for (const r of results) {
    for (const [label, m] of [
      ["GraphQL, one at a time", r.alone],
      ["assembleContext direct, one at a time", r.direct],
      [`GraphQL, ${CONCURRENCY} in flight`, r.loaded],
    ] as const) {
      rows.push([
        `${r.kind} · ${label}`,
        ...rateAndPercentiles(m),
        fmt(mean(m.latencies), " ms"),
        fmt(m.latencies[m.latencies.length - 1], " ms"),
      ]);
    }
  }
  const table = markdownTable(["Store · load", "queries/s", "p50", "p95", "p99", "mean", "max"], rows);
  const seedTable = markdownTable(
    ["Store", "messages", "entries", "seeding", "messages/s", "SQL statements / query", "SQL time / query", "mean GraphQL query", "countTokens / query"],
    results.map((r) => [
      r.kind,
      fmt(r.seeded.messages),
      fmt(r.seeded.entries),
      `${fmt(r.seeded.seconds)} s`,
      fmt(r.seeded.messages / r.seeded.seconds),
      fmt(r.statementsPerQuery),
      fmt(r.sqlMsPerQuery, " ms"),
      fmt(mean(r.alone.latencies), " ms"),
      fmt(r.tokenizeMsPerQuery, " ms"),
    ]),
  );

  const first = results[0];
  const statementList = first
    ? first.statementLog.map((sql, i) => `${i + 1}. ${describe(sql)}`).join("\n")
    : "";
  const shape = first?.shape;

  const describeStore = (r: StoreResult) => {
    const m = mean(r.alone.latencies);
    const d = mean(r.direct.latencies);
    return (
      `on the ${r.kind === "embedded" ? "embedded store" : "PostgreSQL"} one query at a time takes ` +
      `${fmt(percentile(r.alone.latencies, 50), " ms")} at the median (p95 ${fmt(percentile(r.alone.latencies, 95), " ms")}, ` +
      `p99 ${fmt(percentile(r.alone.latencies, 99), " ms")}, mean ${fmt(m, " ms")}), of which ` +
      `${fmt(r.sqlMsPerQuery, " ms")} is spent waiting for the ${fmt(r.statementsPerQuery)} SQL statements ` +
      `(${fmt(r.sqlMsPerQuery / r.statementsPerQuery, " ms")} each, send to callback) and about ` +
      `${fmt(r.tokenizeMsPerQuery, " ms")} counting the tokens of the returned texts (the 20-message baseline ` +
      "is counted on top); " +
      (m - d >= 1
        ? `the \`context\` query adds ${fmt(m - d, " ms")} to \`assembleContext\` called directly (${fmt(d, " ms")}): ` +
          "the key check, GraphQL, and above all the local recall decision, which embeds the message with the " +
          "offline encoder, and the recall search when it says yes (a direct call has neither)"
        : `the GraphQL layer is lost in the noise (\`assembleContext\` called directly averaged ${fmt(d, " ms")}, ` +
          "no faster)")
    );
  };
  const reading = [
    "**Reading.**",
    results.length
      ? `With ${fmt(CONVERSATIONS * MESSAGES)} messages stored, ${results.map(describeStore).join("; ")}.`
      : "",
    first
      ? "The statements are the conversation with its agent's settings and both external ids (one join), the " +
        "newest 20 messages and the kept ones in one statement (both halves on the unique index `(conversationId, seq)`), " +
        "the entry search returning its rows (GIN index on the tenant's entries), the facts, the recall search's statements when the " +
        "message needs recall, and the feed's row after the answer (the key look-up is cached); none " +
        "scans the messages of other conversations, so from the code and the indexes the latency should not grow " +
        "with the number of conversations (this run does not vary it; `BENCH_CONVERSATIONS` does)." +
        results
          .map((r) => {
            const gain = r.loaded.perSecond / r.alone.perSecond;
            return (
              ` With ${CONCURRENCY} queries in flight the ${r.kind} store answers ${fmt(r.loaded.perSecond)}/s, ` +
              `${ratio(r.loaded.perSecond, r.alone.perSecond)} its one-at-a-time rate` +
              (gain < 1.5
                ? ": concurrency buys next to nothing here, so the limit is CPU (the load generator, Engram's " +
                  `single Node thread and the database share ${os.cpus().length} CPUs` +
                  (os.loadavg()[0] > os.cpus().length ? ", with other work running" : "") +
                  "), not the store."
                : ".")
            );
          })
          .join("")
      : "",
    shape
      ? `The answers are what an agent would get: on average ${fmt(shape.blocks)} blocks and ` +
        `${fmt(shape.totalTokens)} tokens against a ${fmt(shape.baselineTokens)}-token baseline of the last 20 ` +
        `messages (short synthetic messages, so the saving is small; see the Tokens section); ` +
        `${(shape.withEntries * 100).toFixed(0)}% had an ENTRIES block and ` +
        `${(shape.withKept * 100).toFixed(0)}% a KEPT block.`
      : "",
  ]
    .filter(Boolean)
    .join(" ");

  return [
    "## Context",
    "",
    `The \`context\` query on a store holding ${fmt(CONVERSATIONS)} conversations of ${fmt(MESSAGES)} messages ` +
      `(${fmt(CONVERSATIONS * MESSAGES)} messages, ${AGENTS} agents, ${fmt(END_USERS)} end users), seeded with ` +
      "`createMany` straight through Prisma in batches of " +
      `${fmt(BATCH)}. Every conversation has a ~150-word summary covering messages 1–${SUMMARY_THROUGH} ` +
      `(\`summaryThroughSeq\` = ${SUMMARY_THROUGH}, so the TAIL is the last ${MESSAGES - SUMMARY_THROUGH} messages), ` +
      `${KEPT_PER_CONVERSATION} older messages with keep score 2–3 (KEPT block) and the rest of the verbatim ` +
      "judge's window scored 0–1; curated entries give the ENTRIES block work: " +
      `${ENTRIES_PER_END_USER} per end user, ${ENTRIES_PER_AGENT} per agent and ${INSTITUTIONAL_ENTRIES} institutional. ` +
      "`ANALYZE` runs after seeding. Messages are synthetic support-desk chat " +
      `(${fmt(first?.seeded.wordsPerMessage ?? Number.NaN)} words on average). Each query asks for a ` +
      "random conversation with a new realistic user message, through the whole GraphQL path in process " +
      "(`buildApp(services).yoga.fetch` with a READER key: key look-up, parse, validation and cost limits, " +
      "`assembleContext`, serialisation of all blocks and items). " +
      `${fmt(WARMUP)} warm-up queries, then ${fmt(QUERIES)} one at a time (the latency one agent sees) and ` +
      `${fmt(QUERIES)} with ${CONCURRENCY} in flight (latency includes waiting for one of the 8 pooled connections); ` +
      `for comparison ${fmt(QUERIES)} calls of \`assembleContext\` straight on the tenant's Prisma client, one at a ` +
      "time (no key look-up, no GraphQL). SQL statements are counted, and the time from sending each to its " +
      "result summed, by wrapping `pg.Client#query`, which every statement of the Prisma adapter's pool goes " +
      "through (measured, not inferred from the code).",
    "",
    measuredOn(skipped),
    "",
    table,
    "",
    seedTable,
    "",
    "The statements of one context query:",
    "",
    statementList,
    "",
    reading,
    "",
    "Reproduce: `npx tsx bench/context/run.ts` (env `BENCH_CONVERSATIONS`, `BENCH_MESSAGES`, `BENCH_QUERIES`, " +
      "`BENCH_WARMUP`, `BENCH_CONCURRENCY`, `BENCH_BATCH`, `BENCH_STORES`, `BENCH_DATABASE_URL`).",
  ].join("\n");
}

runBenchmark("context", benchStore, report);
