import type { ChatRequest, ScriptedAnswer } from "./model-server.ts";

// Scripts route on request.chain, the X-Engram-Chain header each chain's model sends (see
// chains/registry.ts), never on prompt wording, so editing a prompt cannot break them.

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
    switch (request.chain) {
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

/** The "[#seq] role: content" lines of a prompt. */
export function transcriptIn(request: ChatRequest): { seq: number; role: string; content: string }[] {
  const human = request.messages.find((m) => m.role === "user")?.content ?? "";
  return [...human.matchAll(/^\[#(\d+)\] (\w+): (.*)$/gm)].map((m) => ({ seq: Number(m[1]), role: m[2], content: m[3] }));
}

export type FactsScript = {
  triage?: (message: string) => { remember?: boolean; forget?: "NONE" | "SOME" | "ALL"; forgetTargets?: string[]; needsRecall?: boolean };
  /** Candidate facts for a batch of user messages. */
  extract?: (messages: { seq: number; role: string; content: string }[], known: string[]) => { text: string; core?: boolean; seq: number }[];
  /** The judgment of one candidate against the stored facts ([id] text). */
  judge?: (candidate: string, stored: { id: string; text: string }[]) => {
    durability?: string;
    relation?: string;
    relatedFactId?: string | null;
    sensitivity?: string;
  };
};

/** A scripted model for the facts chains; anything else falls back to the memory script. */
export function factsScript(script: FactsScript, fallback = memoryScript()) {
  return (request: ChatRequest): ScriptedAnswer => {
    const human = request.messages.find((m) => m.role === "user")?.content ?? "";
    switch (request.chain) {
      case "triage": {
        const message = human.replace(/^Message:\n/, "");
        return JSON.stringify({ remember: false, forget: "NONE", forgetTargets: [], needsRecall: false, ...script.triage?.(message) });
      }
      case "extract": {
        const known = [...(human.split("<known>")[1]?.split("</known>")[0] ?? "").matchAll(/^- (.*)$/gm)].map((m) => m[1]);
        return `Sure, here you go: ${JSON.stringify({ facts: script.extract?.(transcriptIn(request), known) ?? [] })}`;
      }
      case "fact-judge": {
        const candidate = human.split("Candidate:\n")[1]?.trim() ?? "";
        const storedText = human.split("Stored facts:\n")[1]?.split("\n\nCandidate:")[0] ?? "";
        const stored = [...storedText.matchAll(/^\[([^\]]+)\] (.*)$/gm)].map((m) => ({ id: m[1], text: m[2] }));
        return JSON.stringify({ durability: "durable", relation: "none", relatedFactId: null, sensitivity: "none", ...script.judge?.(candidate, stored) });
      }
      default:
        return fallback(request);
    }
  };
}
