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

/** The "[#seq] role: "content"" lines of a prompt, the quoted text read back. */
export function transcriptIn(request: ChatRequest): { seq: number; role: string; content: string }[] {
  const human = request.messages.find((m) => m.role === "user")?.content ?? "";
  return [...human.matchAll(/^\[#(\d+)\] (\w+): (".*")$/gm)].map((m) => ({ seq: Number(m[1]), role: m[2], content: JSON.parse(m[3]) }));
}

export type FactsScript = {
  triage?: (message: string) => { remember?: boolean; forget?: "NONE" | "SOME" | "ALL"; forgetTargets?: string[]; needsRecall?: boolean };
  /** Candidate facts for a batch of user messages. */
  extract?: (
    messages: { seq: number; role: string; content: string }[],
    known: string[],
  ) => { text: string; core?: boolean; seq: number; subject?: string | null }[];
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
        const message = JSON.parse(human.replace(/^Message:\n/, "")) as string;
        return JSON.stringify({ remember: false, forget: "NONE", forgetTargets: [], needsRecall: false, ...script.triage?.(message) });
      }
      case "extract": {
        const known = [...(human.split("<known>")[1]?.split("</known>")[0] ?? "").matchAll(/^- (".*")$/gm)].map((m) => JSON.parse(m[1]) as string);
        return `Sure, here you go: ${JSON.stringify({ facts: script.extract?.(transcriptIn(request), known) ?? [] })}`;
      }
      case "fact-judge": {
        const candidate = JSON.parse(human.split("Candidate:\n")[1]?.trim() || '""') as string;
        const storedText = human.split("Stored facts:\n")[1]?.split("\n\nCandidate:")[0] ?? "";
        const stored = [...storedText.matchAll(/^\[([^\]]+)\] (".*")$/gm)].map((m) => ({ id: m[1], text: JSON.parse(m[2]) as string }));
        return JSON.stringify({ durability: "durable", relation: "none", relatedFactId: null, sensitivity: "none", ...script.judge?.(candidate, stored) });
      }
      default:
        return fallback(request);
    }
  };
}

/**
 * The numbered snippets of a re-rank prompt, with the turns shown around them. Each text is a
 * JSON string on one line; a neighbour is a "(just before: …)" or "(just after: …)" line.
 */
export function rerankSnippets(request: ChatRequest): { id: number; text: string; before?: string; after?: string }[] {
  const prompt = request.messages.find((m) => m.role === "user")?.content ?? "";
  return [...prompt.matchAll(/^\[(\d+)\] \(\d{4}-\d\d-\d\d\)\n((?:.+\n?)+)/gm)].map((m) => {
    const lines = m[2].trimEnd().split("\n");
    const neighbour = (label: string) => {
      const line = lines.find((l) => l.startsWith(`(${label}: `));
      return line ? (JSON.parse(line.slice(label.length + 3, -1)) as string) : undefined;
    };
    const text = lines.find((l) => l.startsWith('"'))!;
    return { id: Number(m[1]), text: JSON.parse(text) as string, before: neighbour("just before"), after: neighbour("just after") };
  });
}
