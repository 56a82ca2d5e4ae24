import { forTenant } from "../../src/db.ts";
// Recall latency at 10k and 100k snippets on the embedded store and PostgreSQL: the `recall`
// search path (embed the message with the offline encoder, Chroma top 10 for one end user
// leaving one conversation out, PostgreSQL full-text (BM25) top 10, fusion, read-back) timed per call.
import { randomUUID } from "node:crypto";
import { searchSnippets, type RecallMode } from "../../src/memory/recall/recall.ts";
import { benchStores, envInt, fmt, machineLine, markdownTable, openBenchEngram, percentile, rssLine, sampleTreeRss, writeReadmeSection } from "../lib.ts";

const SIZES = (process.env.BENCH_RECALL_SIZES ?? "10000,100000").split(",").map(Number).sort((a, b) => a - b);
const USERS = envInt("BENCH_RECALL_USERS", 100);
const CONVERSATIONS_PER_USER = 10;
const QUERIES = envInt("BENCH_RECALL_QUERIES", 200);
const MODES: RecallMode[] = ["HYBRID", "VECTOR", "KEYWORD"];

// A deterministic pseudo-random stream, so both stores get the same corpus.
let seed = 42;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const WORDS = Array.from({ length: 3000 }, (_, i) => `w${(i * 7919).toString(36)}`).concat(
  "order shoes blue red pasta recipe trip lisbon hotel booking wine dinner table flight refund invoice delivery size gift birthday kettle coffee".split(" "),
);
const sentence = (n: number) => Array.from({ length: n }, () => WORDS[Math.floor(rand() * WORDS.length)]).join(" ");
const unitVector = () => {
  const v = Array.from({ length: 512 }, () => rand() - 0.5);
  const norm = Math.hypot(...v);
  return v.map((x) => x / norm);
};

const rows: string[][] = [];
const skipped: string[] = [];
// The process tree's peak (this process holds the server's services) per store and size, fill and searches included.
const peaks: string[] = [];
const started = performance.now();
for await (const store of benchStores(skipped)) {
  seed = 42;
  const engram = await openBenchEngram(store, { ENGRAM_EMBEDDINGS: "offline" });
  const { services, tenantId } = engram;
  const { model } = await services.embeddings.forTenant(tenantId);
  const agent = await services.db.agent.create({ data: { tenantId, externalId: "bench", name: "bench" } });
  const users: { id: string; conversations: string[] }[] = [];
  for (let u = 0; u < USERS; u++) {
    const user = await services.db.endUser.create({ data: { tenantId, externalId: `user-${u}` } });
    const conversations = [];
    for (let c = 0; c < CONVERSATIONS_PER_USER; c++) {
      conversations.push(
        (await services.db.conversation.create({ data: { tenantId, agentId: agent.id, endUserId: user.id, externalId: `u${u}-c${c}` } })).id,
      );
    }
    users.push({ id: user.id, conversations });
  }

  let have = 0;
  for (const size of SIZES) {
    const rss = sampleTreeRss();
    const fillStarted = performance.now();
    while (have < size) {
      const batch = Math.min(1_000, size - have);
      const snippets = Array.from({ length: batch }, (_, i) => {
        const user = users[(have + i) % USERS];
        return {
          id: randomUUID(),
          tenantId,
          endUserId: user.id,
          conversationId: user.conversations[Math.floor(rand() * CONVERSATIONS_PER_USER)],
          kind: "TURN" as const,
          text: `user: ${sentence(12 + Math.floor(rand() * 20))}\nassistant: ${sentence(10 + Math.floor(rand() * 20))}`,
          messageIds: [randomUUID(), randomUUID()],
          messageSeqs: [2 * (have + i) + 1, 2 * (have + i) + 2],
          occurredAt: new Date(Date.UTC(2025, 0, 1) + Math.floor(rand() * 365) * 86_400_000),
          embeddingModel: model,
          indexedAt: new Date(),
        };
      });
      await services.db.recallSnippet.createMany({ data: snippets });
      await services.vectors.upsert(
        { tenantId, model },
        snippets.map((s) => ({ ...s, vector: unitVector() })),
      );
      have += batch;
    }
    const fillSeconds = (performance.now() - fillStarted) / 1000;

    // One untimed search per user first, so no timed call is a user's first (caches, Chroma's index load).
    for (const user of users) {
      await searchSnippets(forTenant(services.db, tenantId), services.deps, { endUserId: user.id, text: "warm up", k: 10 });
    }
    // That first search starts loading the user's vectors into this process (vectors/cache.ts).
    await services.vectorCache?.loaded();
    for (const mode of MODES) {
      const latencies: number[] = [];
      for (let q = 0; q < QUERIES + 10; q++) {
        const user = users[q % USERS];
        const t0 = performance.now();
        await searchSnippets(forTenant(services.db, tenantId), services.deps, {
          endUserId: user.id,
          text: `what was my ${sentence(3)} order last time?`,
          excludeConversationId: user.conversations[0],
          k: 10,
          mode,
        });
        if (q >= 10) latencies.push(performance.now() - t0); // the first ones warm caches up
      }
      latencies.sort((a, b) => a - b);
      rows.push([
        store.kind,
        size.toLocaleString("en-US"),
        mode.toLowerCase(),
        fmt(percentile(latencies, 50), " ms"),
        fmt(percentile(latencies, 95), " ms"),
        fmt(percentile(latencies, 99), " ms"),
        mode === "HYBRID" ? fmt(fillSeconds, " s") : "",
      ]);
      console.log(rows.at(-1)!.join(" | "));
    }
    rss.stop();
    peaks.push(`${store.kind} at ${size.toLocaleString("en-US")} snippets: ${rssLine(rss.peak())}`);
    console.log(`peak RSS, ${peaks.at(-1)}`);
  }
  await services.close();
  await store.drop();
}

const body = `## Recall latency

The search behind recall (\`searchSnippets\`, what the \`recall\` query and \`recallForTurn\` run before the judge): embed the message with the offline encoder (worker thread); the 40 nearest of one end user's vectors leaving one conversation out, by exact cosine over this process's copy of that user's vectors (\`src/vectors/cache.ts\`; Chroma answers a user's first search while the copy loads); at the same time the PostgreSQL full-text top 40 over the same user's snippets ranked by BM25 (its statistics computed per query from that user's tsvectors, which are read once; of each snippet only the query's lexemes are unnested); the keyword statement returns its hits' snippets, and the vector hits are read back as soon as they are known (each snippet with its stored message seqs); then reciprocal rank fusion. ${QUERIES} calls one at a time per row after one untimed search per user (which starts loading that user's copy; the run waits for the loads before timing) and 10 warm-up calls; ${USERS} end users with ${CONVERSATIONS_PER_USER} conversations each, the snippets spread evenly over them (so a user has size/${USERS} snippets). The corpus is synthetic: random texts over a 3,000-word vocabulary and random 512-d unit vectors (embedding 100k real snippets with the offline encoder would take ~15 minutes per store); the query (\`what was my <3 of those words> order last time?\`) is embedded for real. Chroma is the embedded one (its server on a thread of the PGlite child) in every row; *fill* is the time to insert the rows and upsert the vectors up to that size.

Measured on ${machineLine()}; total run ${fmt((performance.now() - started) / 1000, " s")}.

${markdownTable(["Store", "Snippets", "Retriever", "p50", "p95", "p99", "fill"], rows)}
${skipped.length ? `\nSkipped: ${skipped.join("; ")}.\n` : ""}
Peak resident memory of the process tree (this process holds the server's services and the load generator; the PGlite child runs the store and Chroma's server; sampled every 250 ms from \`/proc\` from the start of each size's fill to its last search): ${peaks.join("; ")}.

Where the time goes, and the goal: "Recall latency: goal and what remains" below.

Reproduce: \`npx tsx bench/recall-latency/run.ts\` (env \`BENCH_RECALL_SIZES\` (default \`10000,100000\`), \`BENCH_RECALL_USERS\`, \`BENCH_RECALL_QUERIES\`, \`BENCH_STORES\`, \`BENCH_DATABASE_URL\`).`;
writeReadmeSection("recall-latency", body);
