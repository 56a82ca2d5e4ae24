// The local recall gate of `context` (no chat model): how well keywords alone, the embedding
// check alone, and both together (what context uses: keywords, else similarity to the recall
// prototypes) tell the messages that need earlier conversations on a hand-labelled set.
// Run: npx tsx bench/recall-gate/run.ts   (offline encoder, no store, no network)
import { readFileSync } from "node:fs";
import { OFFLINE_MODEL, OfflineEmbeddings } from "../../src/embeddings/offline.ts";
import { needsRecallByKeywords } from "../../src/memory/gate/keywords.ts";
import { RECALL_INTENT_THRESHOLD, RECALL_PROTOTYPES, recallIntentSimilarity } from "../../src/memory/gate/recall-intent.ts";
import { fmt, machineLine, markdownTable, warnIfBusy, writeReadmeSection } from "../lib.ts";

type Labelled = { text: string; needsRecall: boolean; kind: string };
type Scored = Labelled & { keywords: boolean; similarity: number };

const { messages } = JSON.parse(readFileSync(new URL("./labelled.json", import.meta.url), "utf8")) as { messages: Labelled[] };

function score(rows: Scored[], predict: (row: Scored) => boolean) {
  let tp = 0, fp = 0, fn = 0;
  for (const row of rows) {
    const said = predict(row);
    if (said && row.needsRecall) tp++;
    else if (said) fp++;
    else if (row.needsRecall) fn++;
  }
  const precision = tp + fp ? tp / (tp + fp) : 1;
  const recall = tp + fn ? tp / (tp + fn) : 1;
  const f1 = precision + recall ? (2 * precision * recall) / (precision + recall) : 0;
  const negatives = rows.filter((r) => !r.needsRecall).length;
  return { precision, recall, f1, flagged: tp + fp, falseAlarmRate: negatives ? fp / negatives : 0, of: rows.length };
}

const THRESHOLDS = Array.from({ length: 41 }, (_, i) => Math.round((0.3 + i * 0.0125) * 10_000) / 10_000);
const both = (t: number) => (row: Scored) => row.keywords || row.similarity >= t;
const embeddingOnly = (t: number) => (row: Scored) => row.similarity >= t;
/** The threshold with the best F1 of the combined gate on these rows (ties: the higher, fewer searches). */
const bestThreshold = (rows: Scored[]) =>
  THRESHOLDS.reduce((best, t) => (score(rows, both(t)).f1 >= score(rows, both(best)).f1 ? t : best), THRESHOLDS[0]);

async function main() {
  warnIfBusy();
  const encoder = new OfflineEmbeddings();
  try {
    const vectors = await encoder.embedDocuments(messages.map((m) => m.text));
    const rows: Scored[] = [];
    for (const [i, m] of messages.entries()) {
      rows.push({ ...m, keywords: needsRecallByKeywords(m.text), similarity: await recallIntentSimilarity(encoder, OFFLINE_MODEL, vectors[i]) });
    }
    const used = RECALL_INTENT_THRESHOLD[OFFLINE_MODEL];
    const chosen = bestThreshold(rows);
    // A check on overfitting: choose on one half, measure on the other, both ways.
    const halves = [rows.filter((_, i) => i % 2 === 0), rows.filter((_, i) => i % 2 === 1)];
    const crossed = halves.map((train, h) => {
      const t = bestThreshold(train);
      return { t, ...score(halves[1 - h], both(t)) };
    });
    const pct = (v: number) => `${(v * 100).toFixed(1)} %`;
    const line = (name: string, s: ReturnType<typeof score>) => [
      name,
      pct(s.precision),
      pct(s.recall),
      s.f1.toFixed(3),
      pct(s.falseAlarmRate),
      `${s.flagged} of ${s.of}`,
    ];
    const table = markdownTable(
      ["Gate", "precision", "recall", "F1", "false alarms (share of no-recall messages)", "messages sent to recall"],
      [
        line("keywords alone (keywords.ts)", score(rows, (r) => r.keywords)),
        line(`embeddings alone (similarity ≥ ${used})`, score(rows, embeddingOnly(used))),
        line(`both: keywords, else similarity ≥ ${used} (what context uses)`, score(rows, both(used))),
        ...crossed.map((c, h) =>
          line(`both, threshold ${c.t} chosen on half ${h + 1}, measured on half ${2 - h}`, c),
        ),
      ],
    );
    const sweep = markdownTable(
      ["similarity threshold", "embeddings alone P / R", "both P / R", "both F1"],
      THRESHOLDS.filter((_, i) => i % 4 === 0).map((t) => {
        const e = score(rows, embeddingOnly(t));
        const b = score(rows, both(t));
        return [String(t), `${pct(e.precision)} / ${pct(e.recall)}`, `${pct(b.precision)} / ${pct(b.recall)}`, b.f1.toFixed(3)];
      }),
    );
    const misses = rows.filter((r) => r.needsRecall && !both(used)(r)).map((r) => `"${r.text}" (${fmt(r.similarity)})`);
    const falseAlarms = rows.filter((r) => !r.needsRecall && both(used)(r)).map((r) => `"${r.text}" (${r.keywords ? "keywords" : fmt(r.similarity)})`);
    const yes = rows.filter((r) => r.needsRecall).length;
    const body = `## Recall gate (local, no model)

When \`context\` gets no verdict from the caller it decides recall before the reply without a chat model: the keyword patterns of \`src/memory/gate/keywords.ts\`, else the message's cosine similarity to the nearest of ${RECALL_PROTOTYPES.length} recall-intent prototype sentences (\`src/memory/gate/recall-intent.ts\`, embedded once per embedder) against a threshold. The set is \`bench/recall-gate/labelled.json\`: ${rows.length} messages written for this (not from LoCoMo), ${yes} labelled needs-recall (references to earlier sessions, the user's own facts, past events, ongoing plans) and ${rows.length - yes} not (general questions, tasks, small talk, new statements, references to the current conversation, and keyword traps such as "try again" or "what happened last week in the stock market?"). Offline encoder (${OFFLINE_MODEL}). The threshold in use is ${used}; the best F1 of the combined gate on the whole set is at ${chosen}.

Measured on ${machineLine()}.

${table}

Threshold sweep (whole set):

${sweep}

Missed at ${used} (${misses.length}): ${misses.join("; ") || "none"}.

False alarms at ${used} (${falseAlarms.length}): ${falseAlarms.join("; ") || "none"}.

A false alarm costs a recall search (the embedding is made anyway) and, with a model, one re-rank call; a miss leaves the reply without earlier conversations unless the caller passes \`gate\`. The threshold was chosen on this set, so the whole-set rows are optimistic; the half/half rows show how it carries to messages it was not chosen on. Other embedders have no measured threshold: with them the keywords decide alone.`;
    writeReadmeSection("recall-gate", body);
    console.log(body);
  } finally {
    await encoder.close();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
