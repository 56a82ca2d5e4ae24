// Prompt tokens per turn on the LoCoMo conversations for three ways of giving an agent its
// history: Engram's (a running summary of at most 150 words + the last 6 messages), the last
// 20 messages, and the whole history. Run: npx tsx bench/tokens/run.ts
//
// Each turn is computed with pure functions that mirror assembleContext's window rules (summary
// on, tail 6, history 20, no kept messages, no entries, summary refreshed before every turn),
// and one conversation is replayed through the real rewriteSummary + assembleContext on the
// embedded store to check that the two agree token for token.
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { RunnableLambda } from "@langchain/core/runnables";
import type { LossJudgeInput, LossVerdict } from "../../src/chains/loss-judge.ts";
import { limitWords, type SummarizerInput } from "../../src/chains/summarizer.ts";
import { formatTranscript, quoteText, type TranscriptMessage } from "../../src/chains/transcript.ts";
import type { VerbatimJudgeInput, VerbatimScores } from "../../src/chains/verbatim-judge.ts";
import { forTenant } from "../../src/db.ts";
import { DEFAULT_AGENT_SETTINGS } from "../../src/memory/conversations/agents.ts";
import { assembleContext } from "../../src/memory/context.ts";
import { rewriteSummary, type SummaryDeps } from "../../src/memory/conversations/summary.ts";
import { countTokens } from "../../src/memory/tokens.ts";
import { createEmbeddedStore, fmt, machineLine, markdownTable, openBenchEngram, writeReadmeSection } from "../lib.ts";

// Read at run time from the shared data folder; never copied into the repository (CC BY-NC 4.0).
const LOCOMO = process.env.BENCH_LOCOMO ?? fileURLToPath(new URL("../../../shared/data/locomo/locomo10.json", import.meta.url));
// Replays this conversation (index into the file) through the real store as a check; "off" skips it.
const CHECK = process.env.BENCH_TOKENS_CHECK ?? "0";

const { tailSize: TAIL, historySize: HISTORY, summaryWordLimit: SUMMARY_WORDS } = DEFAULT_AGENT_SETTINGS;

type Line = { speaker: string; dia_id: string; text: string };
type Sample = { sample_id: string; conversation: Record<string, unknown> & { speaker_a: string; speaker_b: string } };
type Conversation = { id: string; messages: TranscriptMessage[] };

/** Every dialogue line is one message, sessions in order; speaker_a is the USER, speaker_b the ASSISTANT. */
function loadLocomo(file: string): Conversation[] {
  if (!existsSync(file)) throw new Error(`LoCoMo not found at ${file} (set BENCH_LOCOMO).`);
  const samples = JSON.parse(readFileSync(file, "utf8")) as Sample[];
  return samples.map((sample) => {
    const c = sample.conversation;
    const sessions = Object.keys(c)
      .map((key) => /^session_(\d+)$/.exec(key))
      .filter((m): m is RegExpExecArray => m !== null && Array.isArray(c[m[0]]))
      .map((m) => Number(m[1]))
      .sort((a, b) => a - b);
    const lines = sessions.flatMap((n) => c[`session_${n}`] as Line[]).filter((l) => l.text?.trim());
    const messages = lines.map((line, i) => ({
      seq: i + 1,
      role: line.speaker === c.speaker_a ? "USER" : "ASSISTANT",
      content: line.text,
    }));
    return { id: sample.sample_id, messages };
  });
}

/**
 * The scripted summarizer, worst case: always exactly wordLimit words, taken from the end of the
 * previous summary followed by the newly folded messages (so its words are the conversation's
 * own), repeated from the start while there are fewer. limitWords is applied as rewriteSummary does.
 */
function scriptedSummary(input: SummarizerInput): string {
  const words = [input.previousSummary ?? "", ...input.messages.map((m) => m.content)].join(" ").trim().split(/\s+/);
  const out = words.slice(-input.wordLimit);
  for (let i = 0; out.length < input.wordLimit; i++) out.push(words[i % words.length]);
  return limitWords(out.join(" "), input.wordLimit);
}

/** Tokens of formatTranscript(messages), as assembleContext counts a TAIL block or the baseline. */
const transcriptTokens = (messages: TranscriptMessage[]) => (messages.length ? countTokens(formatTranscript(messages)) : 0);

type TurnTokens = { stored: number; engram: number; last20: number; full: number; summary: number; tail: number };

/**
 * Tokens of formatTranscript(messages[from..to-1]) by addition: the transcript's pre-tokens never
 * span the newline before "[#", so tokens(join) = Σ tokens(line + "\n") over all lines but the
 * last + tokens(last line). Exact (checked against countTokens below), and fast on long texts.
 */
function additiveCounter(messages: TranscriptMessage[]) {
  const withNewline = messages.map((m) => countTokens(`${formatTranscript([m])}\n`));
  const alone = messages.map((m) => countTokens(formatTranscript([m])));
  const prefix = [0];
  for (const tokens of withNewline) prefix.push(prefix[prefix.length - 1] + tokens);
  return (from: number, to: number) => (to > from ? prefix[to - 1] - prefix[from] + alone[to - 1] : 0);
}

/**
 * Replays one conversation: before every ASSISTANT message (the agent's model call) the stored
 * history is every message before it. The summary is refreshed first (everything older than the
 * tail folded, as rewriteSummary does), then the three prompts are counted. Windows are counted
 * with countTokens on their transcript as assembleContext does, or by addition when `additive`.
 */
function replay(conversation: Conversation, options: { tail?: number; additive?: boolean } = {}): TurnTokens[] {
  const tail = options.tail ?? TAIL;
  const { messages } = conversation;
  const range = additiveCounter(messages);
  // seq = index + 1, so a window of stored messages is the index range [seq₀ − 1, seqₙ).
  const windowTokens = (window: TranscriptMessage[]) =>
    options.additive ? range(window.length ? window[0].seq - 1 : 0, window.length ? window[window.length - 1].seq : 0) : transcriptTokens(window);
  let summary: string | null = null;
  let summaryThroughSeq = 0;
  const turns: TurnTokens[] = [];
  for (let n = 1; n < messages.length; n++) {
    // n messages are stored; messages[n] is the agent's next message.
    if (messages[n].role !== "ASSISTANT") continue;
    const stored = messages.slice(0, n);
    // rewriteSummary: fold everything unfolded except the last `tail` messages.
    const unfolded = stored.filter((m) => m.seq > summaryThroughSeq);
    const toFold = unfolded.slice(0, Math.max(0, unfolded.length - tail));
    if (toFold.length) {
      summary = scriptedSummary({ previousSummary: summary, messages: toFold, wordLimit: SUMMARY_WORDS });
      summaryThroughSeq = toFold[toFold.length - 1].seq;
    }
    // assembleContext's window with the summary on.
    const recent = stored.slice(-Math.max(HISTORY, tail));
    const history = recent.slice(-HISTORY);
    const unfoldedNow = recent.filter((m) => m.seq > summaryThroughSeq);
    const window = unfoldedNow.length >= tail ? unfoldedNow.slice(-HISTORY) : recent.slice(-tail);
    // The SUMMARY block quotes its text, as every block of the context does.
    const summaryTokens = summary ? countTokens(quoteText(summary)) : 0;
    const tailTokens = windowTokens(window);
    turns.push({
      stored: n,
      engram: summaryTokens + tailTokens,
      last20: windowTokens(history),
      full: range(0, n),
      summary: summaryTokens,
      tail: tailTokens,
    });
  }
  return turns;
}

/** Checks the additive whole-history count against countTokens on every 25th turn. */
function checkFullCounts(conversation: Conversation, turns: TurnTokens[]): { checked: number; mismatches: number } {
  let checked = 0;
  let mismatches = 0;
  for (let k = 0; k < turns.length; k += 25) {
    checked++;
    if (transcriptTokens(conversation.messages.slice(0, turns[k].stored)) !== turns[k].full) mismatches++;
  }
  return { checked, mismatches };
}

/**
 * The same replay through the real code on the embedded store: messages inserted as they come,
 * rewriteSummary with the scripted summarizer (loss judge accepts, verbatim judge keeps nothing)
 * before each assistant message, then assembleContext. Returns turns whose counts differ.
 */
async function checkAgainstStore(conversation: Conversation, expected: TurnTokens[]) {
  const store = createEmbeddedStore();
  const { services, tenantId } = await openBenchEngram(store);
  try {
    const db = forTenant(services.db, tenantId);
    const agent = await db.agent.create({ data: { tenantId, externalId: "locomo-agent", name: "LoCoMo agent" } });
    const endUser = await db.endUser.create({ data: { tenantId, externalId: "locomo-user" } });
    const row = await db.conversation.create({
      data: { tenantId, externalId: conversation.id, agentId: agent.id, endUserId: endUser.id },
    });
    const ignore = () => {};
    const deps: SummaryDeps = {
      summarizer: RunnableLambda.from(async (input: SummarizerInput) => scriptedSummary(input)),
      lossJudge: RunnableLambda.from(async (_: LossJudgeInput): Promise<LossVerdict> => ({ lost: false, reason: "" })),
      verbatimJudge: RunnableLambda.from(async (_: VerbatimJudgeInput): Promise<VerbatimScores> => new Map()),
      pubsub: services.pubsub,
      log: { debug: ignore, info: ignore, warn: ignore, error: ignore },
    };
    let inserted = 0;
    let turn = 0;
    let differ = 0;
    const messages = conversation.messages;
    for (let n = 1; n < messages.length; n++) {
      if (messages[n].role !== "ASSISTANT") continue;
      await db.message.createMany({
        data: messages.slice(inserted, n).map((m) => ({
          tenantId,
          conversationId: row.id,
          seq: m.seq,
          role: m.role as "USER" | "ASSISTANT",
          content: m.content,
          occurredAt: new Date(),
        })),
      });
      inserted = n;
      await db.conversation.update({ where: { id: row.id }, data: { lastSeq: n } });
      await rewriteSummary(db, deps, row.id);
      const context = await assembleContext(db, { conversationId: row.id, message: messages[n - 1].content });
      const want = expected[turn++];
      if (context.totalTokens !== want.engram || context.baselineTokens !== want.last20) {
        if (differ++ < 3) {
          console.warn(`turn ${turn} (seq ${n}): store ${context.totalTokens}/${context.baselineTokens}, pure ${want.engram}/${want.last20}`);
        }
      }
    }
    return { turns: turn, differ };
  } finally {
    await services.close();
    await store.drop();
  }
}

const sum = (values: number[]) => values.reduce((a, b) => a + b, 0);
const mean = (values: number[]) => sum(values) / values.length;
const saving = (ours: number, theirs: number) => `${((1 - ours / theirs) * 100).toFixed(1)}%`;

/** Each message's content repeated `factor` times: the same conversations with longer messages. */
function lengthened(conversation: Conversation, factor: number): Conversation {
  if (factor === 1) return conversation;
  return {
    id: conversation.id,
    messages: conversation.messages.map((m) => ({ ...m, content: Array(factor).fill(m.content.trim()).join(" ") })),
  };
}

async function main() {
  const started = performance.now();
  const conversations = loadLocomo(LOCOMO);

  type Row = { id: string; messages: number; msgTokens: number; turns: TurnTokens[]; full: { checked: number; mismatches: number } };
  const rows: Row[] = conversations.map((conversation) => {
    const turns = replay(conversation);
    const msgTokens = mean(conversation.messages.map((m) => countTokens(formatTranscript([m]))));
    const row = { id: conversation.id, messages: conversation.messages.length, msgTokens, turns, full: checkFullCounts(conversation, turns) };
    console.log(
      `${row.id}: ${turns.length} turns, engram ${fmt(mean(turns.map((t) => t.engram)))}, ` +
        `last-20 ${fmt(mean(turns.map((t) => t.last20)))}, full ${fmt(mean(turns.map((t) => t.full)))} tokens/turn`,
    );
    return row;
  });
  const all = rows.flatMap((r) => r.turns);
  const fullChecked = sum(rows.map((r) => r.full.checked));
  const fullMismatches = sum(rows.map((r) => r.full.mismatches));
  if (fullMismatches) console.warn(`${fullMismatches} of ${fullChecked} whole-history counts differ from countTokens!`);

  // How the saving against the last 20 messages depends on message length and on the tail size.
  const factors = [1, 2, 4, 8];
  const tails = [6, 3, 2, 1];
  const sensitivity = factors.map((factor) => {
    const longer = conversations.map((c) => lengthened(c, factor));
    const msgTokens = mean(longer.flatMap((c) => c.messages.map((m) => countTokens(formatTranscript([m])))));
    const byTail = tails.map((tail) => {
      const turns = longer.flatMap((c) => replay(c, { tail, additive: true }));
      return { tail, engram: mean(turns.map((t) => t.engram)), last20: mean(turns.map((t) => t.last20)), summary: mean(turns.filter((t) => t.summary).map((t) => t.summary)) };
    });
    console.log(`×${factor}: ${fmt(msgTokens)} tokens/message, tail 6 saves ${saving(byTail[0].engram, byTail[0].last20)}`);
    return { factor, msgTokens, byTail };
  });

  let storeCheck: { conversation: string; turns: number; differ: number } | null = null;
  if (CHECK !== "off") {
    const conversation = conversations[Number(CHECK)];
    const expected = rows[Number(CHECK)].turns;
    const t0 = performance.now();
    const result = await checkAgainstStore(conversation, expected);
    storeCheck = { conversation: conversation.id, ...result };
    console.log(
      `store check on ${conversation.id}: ${result.turns} turns, ${result.differ} differ ` +
        `(${((performance.now() - t0) / 1000).toFixed(1)} s)`,
    );
  }

  const section = report(rows, all, sensitivity, { fullChecked, fullMismatches, storeCheck });
  writeReadmeSection("tokens", section);
  console.log(`\n${section}\n\nbench/README.md updated (${((performance.now() - started) / 1000).toFixed(1)} s).`);
}

function report(
  rows: { id: string; messages: number; msgTokens: number; turns: TurnTokens[] }[],
  all: TurnTokens[],
  sensitivity: { factor: number; msgTokens: number; byTail: { tail: number; engram: number; last20: number; summary: number }[] }[],
  checks: { fullChecked: number; fullMismatches: number; storeCheck: { conversation: string; turns: number; differ: number } | null },
): string {
  const line = (id: string, messages: number, msgTokens: number, turns: TurnTokens[]) => {
    const [a, b, c] = [sum(turns.map((t) => t.engram)), sum(turns.map((t) => t.last20)), sum(turns.map((t) => t.full))];
    return [
      id,
      fmt(messages),
      fmt(turns.length),
      fmt(msgTokens),
      fmt(a / turns.length),
      fmt(b / turns.length),
      fmt(c / turns.length),
      saving(a, b),
      saving(a, c),
    ];
  };
  const allMsgTokens = sum(rows.map((r) => r.msgTokens * r.messages)) / sum(rows.map((r) => r.messages));
  const table = markdownTable(
    ["Conversation", "messages", "turns", "tokens / message", "(a) Engram", "(b) last 20", "(c) full history", "(a) vs (b)", "(a) vs (c)"],
    [...rows.map((r) => line(r.id, r.messages, r.msgTokens, r.turns)), line("**all**", sum(rows.map((r) => r.messages)), allMsgTokens, all)],
  );

  const sensitivityTable = markdownTable(
    ["Message length", "tokens / message", "summary tokens", "(b) last 20", ...sensitivity[0].byTail.map((t) => `tail ${t.tail}: (a) / saving`)],
    sensitivity.map((s) => [
      s.factor === 1 ? "as in LoCoMo" : `each message ×${s.factor}`,
      fmt(s.msgTokens),
      fmt(s.byTail[0].summary),
      fmt(s.byTail[0].last20),
      ...s.byTail.map((t) => `${fmt(t.engram)} / ${saving(t.engram, t.last20)}`),
    ]),
  );

  const overall = {
    a: mean(all.map((t) => t.engram)),
    b: mean(all.map((t) => t.last20)),
    c: mean(all.map((t) => t.full)),
    summary: mean(all.filter((t) => t.summary).map((t) => t.summary)),
    tail: mean(all.filter((t) => t.summary).map((t) => t.tail)),
  };
  const savingB = 1 - overall.a / overall.b;
  const worse = all.filter((t) => t.engram > t.last20).length;
  const steady = all.filter((t) => t.stored >= HISTORY);
  const met = savingB >= 0.85;
  const longest = sensitivity[sensitivity.length - 1];
  const store = checks.storeCheck;

  return [
    "## Tokens",
    "",
    "Prompt tokens per turn on the 10 LoCoMo conversations (read at run time from " +
      "`../shared/data/locomo/locomo10.json`, not part of this repository), replayed line by line: each " +
      "dialogue line is one message, `speaker_a` is the USER and `speaker_b` the ASSISTANT (LoCoMo mostly " +
      "alternates; the few runs of one speaker keep that speaker's role). A **turn** is each ASSISTANT " +
      "message, i.e. each model call of the agent; its prompt material covers every message before it (an " +
      "ASSISTANT line that opens a conversation has nothing before it and is not counted). " +
      `**(a) Engram**: the running summary + the TAIL block of the last ${TAIL} messages; the scripted ` +
      `summarizer always returns exactly ${SUMMARY_WORDS} words (the worst case; its words are taken from the ` +
      "conversation itself) and the summary is refreshed before every turn; no kept messages, no entries, facts " +
      `or recall. **(b)** the last ${HISTORY} messages (Engram's \`baselineTokens\`). **(c)** the whole history. ` +
      "Tokens are `countTokens` (o200k_base) of `formatTranscript` text, counted per block as `assembleContext` " +
      "does; the user's new message, sent alongside by the agent in every approach, is not counted. Savings are " +
      "1 − Σ(a)/Σ(b) over all turns (the token bill), not a mean of per-turn ratios.",
    "",
    "Method: pure functions mirroring `assembleContext`'s window rules and `rewriteSummary`'s fold (fast: " +
      "all 2.9k turns in seconds, and the sensitivity table needs 16 more replays; a real store would take " +
      "minutes per replay and measure nothing more about tokens). " +
      (store
        ? `As a check, ${store.conversation} was replayed through the real code on the embedded store (messages ` +
          "inserted as they come, `rewriteSummary` with the scripted summarizer, accepting loss judge and a verbatim " +
          `judge that keeps nothing, then \`assembleContext\`): ${store.differ === 0 ? "all" : `${store.turns - store.differ} of`} ` +
          `${store.turns} turns gave the same \`totalTokens\` and \`baselineTokens\` as the pure functions. `
        : "") +
      "Whole-history tokens (and every window in the sensitivity table) are summed per line, exact because " +
      "o200k pre-tokens never span the newline before `[#`; " +
      `of ${checks.fullChecked} whole-history counts checked against \`countTokens\` on the joined transcript ` +
      `(every 25th turn), ${checks.fullMismatches} differed.`,
    "",
    `Measured on ${machineLine()}.`,
    "",
    table,
    "",
    `**Reading.** Engram's prompt averages ${fmt(overall.a)} tokens per turn against ${fmt(overall.b)} for the ` +
      `last ${HISTORY} messages and ${fmt(overall.c)} for the whole history: a saving of ` +
      `**${(savingB * 100).toFixed(1)}% against the last ${HISTORY} messages** and ` +
      `**${((1 - overall.a / overall.c) * 100).toFixed(1)}% against the full history**. ` +
      (met
        ? `The product target of ≥ 85% against the last ${HISTORY} messages is met.`
        : `The product target of ≥ 85% against the last ${HISTORY} messages is **not met**, and cannot be with a ` +
          `tail of ${TAIL}: the tail alone is ${TAIL}/${HISTORY} = ${((TAIL / HISTORY) * 100).toFixed(0)}% of the ` +
          `${HISTORY} messages, so the saving is about 1 − (S + ${TAIL}·m)/(${HISTORY}·m) = ` +
          `${(100 - (TAIL / HISTORY) * 100).toFixed(0)}% − S/(${HISTORY}·m) for a summary of S tokens and messages ` +
          `of m tokens, below ${(100 - (TAIL / HISTORY) * 100).toFixed(0)}% whatever the message length. ` +
          `LoCoMo's messages are short chat lines (${fmt(allMsgTokens)} tokens with their \`[#seq] role:\` prefix), ` +
          `so the ${SUMMARY_WORDS}-word summary (${fmt(overall.summary)} tokens) costs as much as ` +
          `${fmt(overall.summary / allMsgTokens)} messages and the tail ${fmt(overall.tail)} more. ` +
          `Short histories barely matter: (a) is larger than (b) in only ${fmt(worse)} of ${fmt(all.length)} turns ` +
          `(just past the ${TAIL}th message), and counting only turns with at least ${HISTORY} messages stored the ` +
          `saving is ${saving(sum(steady.map((t) => t.engram)), sum(steady.map((t) => t.last20)))}. ` +
          `Reaching 85% needs S/m + tail ≤ ${(0.15 * HISTORY).toFixed(0)} messages' worth: a tail of 1–2 with ` +
          "messages several times longer than LoCoMo's, as the table below shows (the longest rows: " +
          `${longest.byTail.map((t) => `tail ${t.tail} ${saving(t.engram, t.last20)}`).join(", ")}). ` +
          "Against the whole history the saving grows with the conversation's length, since (a) stays flat."),
    "",
    `Sensitivity: the same replay with each message's text repeated k times (longer messages), for tails of ` +
      `${sensitivity[0].byTail.map((t) => t.tail).join(", ")} (the summary stays at ${SUMMARY_WORDS} words; ` +
      `(b) is always the last ${HISTORY} messages). Cells are mean tokens per turn of (a) / saving against (b).`,
    "",
    sensitivityTable,
    "",
    "Reproduce: `npx tsx bench/tokens/run.ts` (env `BENCH_LOCOMO` for another path to locomo10.json, " +
      "`BENCH_TOKENS_CHECK=off` to skip the store check or `=N` to check conversation N).",
  ].join("\n");
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
