import type { ChatRequest, ScriptedAnswer } from "./model-server.ts";

/** Which chain a request to the scripted model server comes from, by its system prompt. */
export function chainOf(request: ChatRequest): string {
  const system = request.messages.find((m) => m.role === "system")?.content ?? "";
  if (system.includes("running summary of a conversation")) return "summary";
  if (system.includes("You check a rewrite")) return "loss-judge";
  if (system.includes("still needs word for word")) return "verbatim-judge";
  if (system.includes("compact an organisation's memory log")) return "compact";
  return "unknown";
}

/** The message numbers ("[#12] user: …") in a prompt's section that starts with `heading`. */
export function seqsIn(request: ChatRequest, heading: string): number[] {
  const human = request.messages.find((m) => m.role === "user")?.content ?? "";
  const section = human.split(heading)[1]?.split(/\n\n[A-Z][a-z]+ [a-z]+:\n/)[0] ?? "";
  return [...section.matchAll(/\[#(\d+)\]/g)].map((m) => Number(m[1]));
}

/** A summary of exactly `words` words that names the last folded message, as a worst case. */
export function summaryOfLength(words: number, tag: string): string {
  const head = `Summary through ${tag}.`.split(" ");
  return [...head, ...Array.from({ length: words - head.length }, (_, i) => `w${i}`)].join(" ");
}

export type MemoryScript = {
  /** Return true to make the loss judge reject this rewrite. */
  reject?: (request: ChatRequest, call: number) => boolean;
  /** Sequence numbers the verbatim judge calls essential. */
  essential?: number[];
  wordLimit?: number;
};

/** A plausible memory model: max-length summaries, a loss judge and a verbatim judge on cue. */
export function memoryScript(script: MemoryScript = {}) {
  let lossCalls = 0;
  return (request: ChatRequest): ScriptedAnswer => {
    switch (chainOf(request)) {
      case "summary": {
        const folded = seqsIn(request, "Newly folded messages:\n");
        return JSON.stringify({ summary: summaryOfLength(script.wordLimit ?? 150, `#${folded.at(-1)}`) });
      }
      case "loss-judge": {
        lossCalls++;
        const lost = script.reject?.(request, lossCalls) ?? false;
        return `Here is my verdict:\n\`\`\`json\n${JSON.stringify({ lost, reason: lost ? "dropped the user's budget of 400 EUR" : "nothing the user said was lost" })}\n\`\`\``;
      }
      case "verbatim-judge": {
        const older = seqsIn(request, "Older messages:\n");
        return JSON.stringify({
          scores: older.map((seq) => ({ seq, score: script.essential?.includes(seq) ? 3 : 1 })),
        });
      }
      default:
        return "{}";
    }
  };
}
