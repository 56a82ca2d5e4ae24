// searchMemory (the inspector's search across users) over a tenant of realistic size, on the
// embedded store and on PostgreSQL. Run: npx tsx bench/memory-search/run.ts
import { randomUUID } from "node:crypto";
import { forTenant } from "../../src/db.ts";
import { searchMemory } from "../../src/memory/search.ts";
import { envInt, fmt, markdownTable, measuredOn, openBenchEngram, percentile, runBenchmark, type BenchStore } from "../lib.ts";

const USERS = envInt("BENCH_SEARCH_USERS", 200);
const FACTS_PER_USER = envInt("BENCH_SEARCH_FACTS", 50);
const SNIPPETS_PER_USER = envInt("BENCH_SEARCH_SNIPPETS", 100);
const EVENTS = envInt("BENCH_SEARCH_EVENTS", 20_000);
const ENTRIES = envInt("BENCH_SEARCH_ENTRIES", 2_000);
const QUERIES = envInt("BENCH_SEARCH_QUERIES", 100);

// A deterministic generator and a 3,000-word vocabulary: every run searches the same corpus.
let seed = 16;
const rand = () => ((seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31);
const VOCABULARY = Array.from({ length: 3_000 }, (_, i) => `w${i.toString(36)}${"aeiou"[i % 5]}x`);
const word = () => VOCABULARY[Math.floor(rand() * VOCABULARY.length)];
const sentence = (n: number) => Array.from({ length: n }, word).join(" ");

type Row = string[];

async function fill(store: BenchStore) {
  const engram = await openBenchEngram(store);
  const { services, tenantId } = engram;
  const db = services.db;
  const agent = await db.agent.create({ data: { tenantId, externalId: "bench-agent", name: "bench" } });
  const users: { id: string; externalId: string; conversationId: string }[] = [];
  for (let u = 0; u < USERS; u++) {
    const user = await db.endUser.create({ data: { tenantId, externalId: `user-${u}` } });
    const conversation = await db.conversation.create({ data: { tenantId, agentId: agent.id, endUserId: user.id, externalId: `c-${u}` } });
    users.push({ id: user.id, externalId: user.externalId, conversationId: conversation.id });
  }
  const started = performance.now();
  for (const user of users) {
    await db.fact.createMany({
      data: Array.from({ length: FACTS_PER_USER }, () => ({ tenantId, endUserId: user.id, text: `${sentence(10)}.`, origin: "API" })),
    });
    await db.recallSnippet.createMany({
      data: Array.from({ length: SNIPPETS_PER_USER }, () => ({
        tenantId,
        endUserId: user.id,
        conversationId: user.conversationId,
        kind: "TURN" as const,
        text: `user: ${sentence(20)}\nassistant: ${sentence(15)}`,
        messageIds: [randomUUID(), randomUUID()],
        messageSeqs: [1, 2],
        occurredAt: new Date(Date.UTC(2026, 0, 1) + Math.floor(rand() * 300) * 86_400_000),
      })),
    });
  }
  for (let done = 0; done < EVENTS; done += 1_000) {
    await db.memoryEvent.createMany({
      data: Array.from({ length: Math.min(1_000, EVENTS - done) }, () => ({
        tenantId,
        scope: "ENTITY" as const,
        scopeRef: users[Math.floor(rand() * USERS)].externalId,
        kind: "call_summary",
        body: `## Call\n\n${sentence(60)}`,
        source: "bench",
        occurredAt: new Date(Date.UTC(2026, 0, 1) + Math.floor(rand() * 300) * 86_400_000),
      })),
    });
  }
  await db.memoryEntry.createMany({
    data: Array.from({ length: ENTRIES }, () => ({
      tenantId,
      scope: "ENTITY" as const,
      scopeRef: users[Math.floor(rand() * USERS)].externalId,
      title: sentence(6),
      summary: sentence(80),
      tags: [word()],
      importance: 3,
      source: "MANUAL" as const,
    })),
  });
  return { engram, users, fillSeconds: (performance.now() - started) / 1000 };
}

async function benchStore(store: BenchStore): Promise<Row[]> {
  const { engram, users, fillSeconds } = await fill(store);
  const db = forTenant(engram.services.db, engram.tenantId);
  const shapes: { name: string; input: (q: number) => Parameters<typeof searchMemory>[1] }[] = [
    { name: "one word, every user", input: () => ({ text: word() }) },
    { name: "two words, every user", input: () => ({ text: `${word()} ${word()}` }) },
    { name: "one word, one user", input: (q) => ({ text: word(), endUserId: users[q % USERS].id }) },
    { name: "one word, facts only", input: () => ({ text: word(), kinds: ["FACT"] }) },
    // No English word: only the text as typed (ILIKE) can match it.
    { name: "an id as typed, every user", input: () => ({ text: `${randomUUID().slice(0, 8)}` }) },
  ];
  const rows: Row[] = [];
  for (const shape of shapes) {
    const latencies: number[] = [];
    let hits = 0;
    for (let q = 0; q < QUERIES + 5; q++) {
      const t0 = performance.now();
      const found = await searchMemory(db, { ...shape.input(q), first: 30 });
      if (q >= 5) {
        latencies.push(performance.now() - t0); // the first ones warm caches up
        hits += found.length;
      }
    }
    latencies.sort((a, b) => a - b);
    rows.push([
      store.kind,
      shape.name,
      fmt(hits / QUERIES),
      fmt(percentile(latencies, 50), " ms"),
      fmt(percentile(latencies, 95), " ms"),
      fmt(percentile(latencies, 99), " ms"),
      shape === shapes[0] ? fmt(fillSeconds, " s") : "",
    ]);
    console.log(rows.at(-1)!.join(" | "));
  }
  await engram.services.close();
  return rows;
}

runBenchmark("memory-search", benchStore, (results, skipped) => {
  const facts = USERS * FACTS_PER_USER;
  const snippets = USERS * SNIPPETS_PER_USER;
  return `## Memory search across users

\`searchMemory\` (the inspector's Search view) called ${QUERIES} times one at a time per row after 5 warm-up calls, through the domain function on the tenant's scoped client (no HTTP), 30 hits at most. One tenant holds ${USERS.toLocaleString("en-US")} users with ${facts.toLocaleString("en-US")} facts (${FACTS_PER_USER} each, the cap), ${snippets.toLocaleString("en-US")} recall snippets, ${EVENTS.toLocaleString("en-US")} events and ${ENTRIES.toLocaleString("en-US")} entries, random texts over a 3,000-word vocabulary (a word is in about 1 in 300 facts). A query is one statement for whether the text has words, then one per kind, run at once: every word of the text (English stemming, ranked by \`ts_rank\`) on each kind's stored, GIN-indexed tsvector (facts and events have theirs since migration 0009; before it they were parsed per row per query, about 170 ms for 1,000 events on PostgreSQL). *An id as typed* is a random 8-character hex string: a word to the parser, so it takes the indexed path too and finds nothing. *fill* is the time to insert the rows.

${measuredOn(skipped)}

${markdownTable(["Store", "Query", "hits", "p50", "p95", "p99", "fill"], results.flat())}

Reproduce: \`npx tsx bench/memory-search/run.ts\` (env \`BENCH_SEARCH_USERS\`, \`BENCH_SEARCH_FACTS\`, \`BENCH_SEARCH_SNIPPETS\`, \`BENCH_SEARCH_EVENTS\`, \`BENCH_SEARCH_ENTRIES\`, \`BENCH_SEARCH_QUERIES\`, \`BENCH_STORES\`, \`BENCH_DATABASE_URL\`).`;
});
