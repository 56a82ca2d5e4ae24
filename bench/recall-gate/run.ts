// The local recall gate of `context` (no chat model): how well keywords alone, the embedding
// check alone, and both together (what context uses: keywords, else whether the message is
// nearer the recall prototypes than the no-recall ones) tell the messages that need earlier
// conversations, on a hand-labelled set the margin is chosen on and a second one it is not.
// Run: npx tsx bench/recall-gate/run.ts   (offline encoder, no store, no network)
import { readFileSync } from "node:fs";
import { OFFLINE_MODEL, OfflineEmbeddings } from "../../src/embeddings/offline.ts";
import { needsRecallByKeywords } from "../../src/memory/gate/keywords.ts";
import { NO_RECALL_PROTOTYPES, RECALL_INTENT_MARGIN, RECALL_PROTOTYPES, recallIntent } from "../../src/memory/gate/recall-intent.ts";
import { fmt, machineLine, markdownTable, warnIfBusy, writeReadmeSection } from "../lib.ts";

type Labelled = { text: string; needsRecall: boolean; kind: string };
/** A message with the keyword verdict and its similarity to the nearest prototype of each set. */
type Scored = Labelled & { keywords: boolean; recall: number; other: number };

const load = (file: string) => (JSON.parse(readFileSync(new URL(file, import.meta.url), "utf8")) as { messages: Labelled[] }).messages;

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

type Margins = { margin: number; withKeywords: number };
const MARGINS = Array.from({ length: 25 }, (_, i) => Math.round((-0.15 + i * 0.0125) * 10_000) / 10_000);
// In the order of fewer messages sent to recall, so that among ties bestMargins keeps the last.
const PAIRS: Margins[] = MARGINS.flatMap((margin) => [-1, ...MARGINS].filter((k) => k <= margin).map((withKeywords) => ({ margin, withKeywords })));
const margin = (m: number) => (row: Scored) => row.recall - row.other >= m;
/** The gate context runs: the margin, lowered for a message the keyword patterns match (-1: any keyword match). */
const both = (m: Margins) => (row: Scored) => row.recall - row.other >= (row.keywords ? m.withKeywords : m.margin);
const show = (m: Margins) => (m.withKeywords === -1 ? `${m.margin}, any keyword match` : `${m.margin}, ${m.withKeywords} with keywords`);
/** The gate before the no-recall prototypes: the nearest recall prototype at 0.375 or more. */
const PREVIOUS_THRESHOLD = 0.375;
const previous = (row: Scored) => row.keywords || row.recall >= PREVIOUS_THRESHOLD;
/** The margins with the best F1 of the combined gate on these rows (ties: the higher, fewer searches). */
const bestMargins = (rows: Scored[]) => PAIRS.reduce((best, m) => (score(rows, both(m)).f1 >= score(rows, both(best)).f1 ? m : best), PAIRS[0]);

async function scored(encoder: OfflineEmbeddings, messages: Labelled[]): Promise<Scored[]> {
  const vectors = await encoder.embedDocuments(messages.map((m) => m.text));
  return Promise.all(
    messages.map(async (m, i) => ({ ...m, keywords: needsRecallByKeywords(m.text), ...(await recallIntent(encoder, OFFLINE_MODEL, vectors[i])) })),
  );
}

async function main() {
  warnIfBusy();
  const encoder = new OfflineEmbeddings();
  try {
    const rows = await scored(encoder, load("./labelled.json"));
    const heldOut = await scored(encoder, load("./held-out.json"));
    const used = RECALL_INTENT_MARGIN[OFFLINE_MODEL];
    const chosen = bestMargins(rows);
    // A check on overfitting within the set: choose on one half, measure on the other, both ways.
    const halves = [rows.filter((_, i) => i % 2 === 0), rows.filter((_, i) => i % 2 === 1)];
    const crossed = halves.map((train, h) => {
      const m = bestMargins(train);
      return { m, ...score(halves[1 - h], both(m)) };
    });
    const pct = (v: number) => `${(v * 100).toFixed(1)} %`;
    const line = (set: string, name: string, s: ReturnType<typeof score>) => [
      set,
      name,
      pct(s.precision),
      pct(s.recall),
      s.f1.toFixed(3),
      pct(s.falseAlarmRate),
      `${s.flagged} of ${s.of}`,
    ];
    const table = markdownTable(
      ["Set", "Gate", "precision", "recall", "F1", "false alarms (share of no-recall messages)", "messages sent to recall"],
      [
        line("labelled", "keywords alone (keywords.ts)", score(rows, (r) => r.keywords)),
        line("labelled", `embeddings alone (margin ${used.margin})`, score(rows, margin(used.margin))),
        line("labelled", `both, any keyword match, else margin ${used.margin}`, score(rows, both({ ...used, withKeywords: -1 }))),
        line("labelled", `**both: margins ${show(used)} (what context uses)**`, score(rows, both(used))),
        line("labelled", `both, the gate before (nearest recall prototype ≥ ${PREVIOUS_THRESHOLD}, no no-recall prototypes)`, score(rows, previous)),
        ...crossed.map((c, h) => line(`labelled, half ${2 - h}`, `both, margins ${show(c.m)} chosen on half ${h + 1}`, c)),
        line("held-out", "keywords alone (keywords.ts)", score(heldOut, (r) => r.keywords)),
        line("held-out", `embeddings alone (margin ${used.margin})`, score(heldOut, margin(used.margin))),
        line("held-out", `both, any keyword match, else margin ${used.margin}`, score(heldOut, both({ ...used, withKeywords: -1 }))),
        line("held-out", `**both: margins ${show(used)} (what context uses)**`, score(heldOut, both(used))),
        line("held-out", `both, the gate before (≥ ${PREVIOUS_THRESHOLD})`, score(heldOut, previous)),
      ],
    );
    const sweep = markdownTable(
      ["margin", "with keywords", "labelled: P / R", "labelled: F1", "held-out: P / R", "held-out: F1"],
      [
        ...MARGINS.filter((_, i) => i % 2 === 0).map((m) => ({ ...used, margin: m })),
        ...MARGINS.filter((m, i) => i % 2 === 0 && m <= used.margin).map((k) => ({ ...used, withKeywords: k })),
      ].map((m) => {
        const a = score(rows, both(m));
        const b = score(heldOut, both(m));
        return [String(m.margin), String(m.withKeywords), `${pct(a.precision)} / ${pct(a.recall)}`, a.f1.toFixed(3), `${pct(b.precision)} / ${pct(b.recall)}`, b.f1.toFixed(3)];
      }),
    );
    const near = (r: Scored) => `${fmt(r.recall)} vs ${fmt(r.other)}${r.keywords ? ", keywords" : ""}`;
    const listed = (set: Scored[], pick: (r: Scored) => boolean) => {
      const found = set.filter(pick).map((r) => `"${r.text}" (${near(r)})`);
      return `(${found.length}): ${found.join("; ") || "none"}`;
    };
    const gate = both(used);
    const count = (set: Scored[]) => ({ yes: set.filter((r) => r.needsRecall).length, all: set.length });
    const [a, b] = [count(rows), count(heldOut)];
    const body = `## Recall gate (local, no model)

When \`context\` gets no verdict from the caller it decides recall before the reply without a chat model: the message's embedding compared with ${RECALL_PROTOTYPES.length} recall-intent prototype sentences and ${NO_RECALL_PROTOTYPES.length} that need no recall (greetings and thanks, general knowledge, self-contained tasks, news the user tells, follow-ups on the current reply; \`src/memory/gate/recall-intent.ts\`, embedded once per embedder): recall when the nearest recall prototype is closer than the nearest no-recall one by a margin (cosine similarity; it may be negative), a lower one when a keyword pattern of \`src/memory/gate/keywords.ts\` matches. Offline encoder (${OFFLINE_MODEL}). Two sets, written for this (not from LoCoMo), each labelled needs-recall (references to earlier sessions, the user's own facts, past events, ongoing plans) or not (general questions, tasks, small talk, new statements, references to the current conversation, and keyword traps such as "try again" or "what happened last week in the stock market?"): \`bench/recall-gate/labelled.json\`, ${a.all} messages (${a.yes} need recall), on which both margins are chosen together (best F1 of the gate: ${show(chosen)}; in use: ${show(used)}), and \`bench/recall-gate/held-out.json\`, ${b.all} messages (${b.yes} need recall), never used to choose anything: written before the no-recall prototypes, except 7 general questions that repeated labelled.json word for word and were replaced after them (a review found the repeats, and one no-recall prototype that was a labelled.json message, also replaced).

Measured on ${machineLine()}.

${table}

Each margin moved alone from the ones in use:

${sweep}

Missed by the gate in use: labelled ${listed(rows, (r) => r.needsRecall && !gate(r))}. Held-out ${listed(heldOut, (r) => r.needsRecall && !gate(r))}.

False alarms of the gate in use (recall similarity vs no-recall similarity): labelled ${listed(rows, (r) => !r.needsRecall && gate(r))}. Held-out ${listed(heldOut, (r) => !r.needsRecall && gate(r))}.

A false alarm costs a recall search (the embedding is made anyway) and, with a model, one re-rank call before the reply; a miss leaves the reply without earlier conversations unless the caller passes \`gate\`. A keyword match is embedded and checked too, against the lower margin: the search would embed it anyway. Other embedders have no measured margin: with them the keywords decide alone.`;
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
