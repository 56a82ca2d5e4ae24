// What memory costs in model tokens against what it saves in prompt tokens, per turn.
// Run: npx tsx bench/model-cost/run.ts   (BENCH_MODEL_COST_CONVERSATIONS=conv-26,conv-30 picks them)
//
// LoCoMo turns are replayed through the real API and the real jobs (recordTurn, then the worker's
// turn job, summary rewrites with both judges, the background gate, batch and quiet extraction
// with the fact judge, recall indexing on the offline encoder) against a scripted
// OpenAI-compatible server on loopback. Before each turn the agent asks `context` for the user's
// message, as it would before its model call. Model work is what Engram recorded in ModelUsage
// (provider-reported tokens: the scripted server counts a token per 4 characters, in and out),
// by chain. What memory saves is `context`'s own accounting: baselineTokens (the last 20
// messages whole) minus totalTokens (facts, recall, entries, summary, kept and tail), and the
// whole history (o200k_base) minus totalTokens.
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { formatTranscript } from "../../src/chains/transcript.ts";
import { countTokens } from "../../src/memory/tokens.ts";
import { startEngramWithModel } from "../../test/helpers/engram.ts";
import { factsScript, memoryScript } from "../../test/helpers/scripted-memory-model.ts";
import { until } from "../../test/helpers/until.ts";
import { fmt, machineLine, markdownTable, warnIfBusy, writeReadmeSection } from "../lib.ts";

const LOCOMO = process.env.BENCH_LOCOMO ?? fileURLToPath(new URL("../../../shared/data/locomo/locomo10.json", import.meta.url));
const WANTED = (process.env.BENCH_MODEL_COST_CONVERSATIONS ?? "conv-26").split(",").map((s) => s.trim());

type Line = { speaker: string; text: string };
type Sample = { sample_id: string; conversation: Record<string, unknown> & { speaker_a: string; speaker_b: string } };
type Pair = { session: number; user: string; assistant: string | null };

/** speaker_a's lines are the user's, each paired with the speaker_b line after it; one Engram conversation per session. */
function pairsOf(sample: Sample): Pair[] {
  const c = sample.conversation;
  const sessions = Object.keys(c)
    .map((key) => /^session_(\d+)$/.exec(key))
    .filter((m): m is RegExpExecArray => m !== null && Array.isArray(c[m[0]]))
    .map((m) => Number(m[1]))
    .sort((a, b) => a - b);
  const pairs: Pair[] = [];
  for (const session of sessions) {
    for (const line of (c[`session_${session}`] as Line[]).filter((l) => l.text?.trim())) {
      const last = pairs.at(-1);
      if (line.speaker === c.speaker_a) pairs.push({ session, user: line.text, assistant: null });
      else if (last && last.session === session && last.assistant === null) last.assistant = line.text;
    }
  }
  return pairs;
}

/** A plausible model: 150-word summaries and their judges, a gate that remembers first-person statements, one fact per such turn. */
const script = factsScript(
  {
    triage: (message) => ({ remember: /\b(I|my|I'm|I've)\b/.test(message) }),
    extract: (messages) =>
      messages
        .filter((m) => m.role === "user" && /\bI (am|have|love|like|work)\b/.test(m.content))
        .slice(0, 2)
        .map((m) => ({ text: `The user said: ${m.content.slice(0, 120)}`, seq: m.seq })),
  },
  memoryScript(),
);

async function replay(sample: Sample) {
  const { model, engram } = await startEngramWithModel({ worker: true, env: { ENGRAM_EMBEDDINGS: "offline" }, respond: script });
  try {
    const user = sample.sample_id;
    const saved: { vsLast20: number; vsHistory: number; sent: number }[] = [];
    const history: { seq: number; role: string; content: string }[] = [];
    let conversationId: string | null = null;
    let session = -1;
    const pairs = pairsOf(sample);
    for (const [i, pair] of pairs.entries()) {
      if (pair.session !== session) {
        session = pair.session;
        conversationId = null;
        history.length = 0;
      }
      if (conversationId) {
        const { data } = await engram.gql(
          `query($input: ContextInput!) { context(input: $input) { totalTokens baselineTokens } }`,
          { input: { conversationId, message: pair.user } },
          engram.tenant.reader,
        );
        const whole = countTokens(formatTranscript(history));
        saved.push({ sent: data.context.totalTokens, vsLast20: data.context.baselineTokens - data.context.totalTokens, vsHistory: whole - data.context.totalTokens });
      }
      const { data } = await engram.gql(
        `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { conversation { id } } }`,
        {
          input: {
            agentExternalId: "locomo",
            endUserExternalId: user,
            conversationExternalId: `${user}-s${pair.session}`,
            clientTurnId: `${user}-${i}`,
            userMessage: pair.user,
            assistantMessage: pair.assistant,
          },
        },
        engram.tenant.writer,
      );
      conversationId = data.recordTurn.conversation.id;
      history.push({ seq: history.length + 1, role: "USER", content: pair.user });
      if (pair.assistant) history.push({ seq: history.length + 1, role: "ASSISTANT", content: pair.assistant });
    }
    // Every follow-up has run: no job but the recurring ones is waiting.
    await until(
      "the memory work to finish",
      async () => {
        const [{ waiting }] = await engram.services.db.$queryRaw<{ waiting: number }[]>`
          SELECT count(*)::int AS waiting FROM "agenda_jobs"
          WHERE "next_run_at" IS NOT NULL AND "repeat_interval" IS NULL AND "name" <> 'memory.extract-quiet'`;
        return waiting === 0;
      },
      900_000,
    );
    const usage = await engram.services.db.modelUsage.groupBy({
      by: ["chain"],
      where: { tenantId: engram.tenant.tenantId },
      _count: { _all: true },
      _sum: { inputTokens: true, outputTokens: true },
    });
    return { sample: sample.sample_id, turns: pairs.length, saved, usage, calls: model.requests.length };
  } finally {
    await engram.stop();
    await model.stop();
  }
}

async function main() {
  warnIfBusy();
  if (!existsSync(LOCOMO)) throw new Error(`LoCoMo not found at ${LOCOMO} (set BENCH_LOCOMO).`);
  const samples = (JSON.parse(readFileSync(LOCOMO, "utf8")) as Sample[]).filter((s) => WANTED.includes(s.sample_id));
  const results = [];
  for (const sample of samples) results.push(await replay(sample));

  const turns = results.reduce((n, r) => n + r.turns, 0);
  const byChain = new Map<string, { calls: number; tokens: number }>();
  for (const r of results) {
    for (const u of r.usage) {
      const entry = byChain.get(u.chain) ?? { calls: 0, tokens: 0 };
      entry.calls += u._count._all;
      entry.tokens += (u._sum.inputTokens ?? 0) + (u._sum.outputTokens ?? 0);
      byChain.set(u.chain, entry);
    }
  }
  const workTokens = [...byChain.values()].reduce((n, c) => n + c.tokens, 0);
  const workCalls = [...byChain.values()].reduce((n, c) => n + c.calls, 0);
  const saved = results.flatMap((r) => r.saved);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
  const savedVs20 = mean(saved.map((s) => s.vsLast20));
  const savedVsHistory = mean(saved.map((s) => s.vsHistory));
  const perTurn = workTokens / turns;
  const rows = [...byChain].sort((a, b) => b[1].tokens - a[1].tokens).map(([chain, c]) => [chain, c.calls, fmt(c.calls / turns), fmt(c.tokens / turns), `${((100 * c.tokens) / workTokens).toFixed(1)} %`]);
  const goal = perTurn <= 0.5 * savedVsHistory;
  const section = `## Model cost per turn: does memory pay for itself?

LoCoMo ${results.map((r) => r.sample).join(", ")} (${turns} turns, one Engram conversation per session), replayed through
the real API and jobs with the summary, extraction and recall on, against a scripted model on loopback
(bench/model-cost/run.ts). Measured on ${machineLine()}.

| memory work, by chain | calls | calls per turn | tokens per turn | share |
|---|---|---|---|---|
${rows.map((r) => `| ${r.join(" | ")} |`).join("\n")}
| **all** | ${workCalls} | ${fmt(workCalls / turns)} | ${fmt(perTurn)} | 100 % |

| prompt tokens per turn | tokens |
|---|---|
| sent by Engram (\`context\` totalTokens) | ${fmt(mean(saved.map((s) => s.sent)))} |
| saved against the last 20 messages | ${fmt(savedVs20)} |
| saved against the whole session history | ${fmt(savedVsHistory)} |

Memory work costs **${fmt(perTurn / Math.max(1, savedVsHistory), "×")}** the tokens it saves against sending the whole
history (goal ≤ 0.5×: ${goal ? "met" : "not met"}), and ${fmt(perTurn / Math.max(1, savedVs20), "×")} against the last 20 messages.
Model-work tokens are cheap-model tokens; the saved ones are the agent's own (usually larger) model's,
so the price ratio is better than the token ratio. ${[...byChain][0] ? `What dominates: ${[...byChain].sort((a, b) => b[1].tokens - a[1].tokens)[0][0]}.` : ""}`;
  writeReadmeSection("model-cost", section);
  console.log(section);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
