import type { Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/metered.ts";
import { jsonAnswerChain, modelInteger as integer } from "./json.ts";
import { rerankPrompt } from "./rerank.prompt.ts";
import { quoteText } from "./transcript.ts";

export type RerankInput = {
  message: string;
  /** `before`/`after`: the turns around the snippet in its conversation, shown for context only. */
  snippets: { text: string; occurredAt: Date; before?: string | null; after?: string | null }[];
};

/** 0 irrelevant, 1 related, 2 useful background, 3 essential; one per snippet, in input order. */
export type RerankScores = (0 | 1 | 2 | 3)[];

const answer = z.object({
  scores: z.array(z.object({ id: integer, score: integer.pipe(z.number().min(0).max(3)) })),
});

// A neighbouring turn is context, not a candidate: its opening is enough.
const NEIGHBOUR_CHARS = 240;
const neighbour = (label: string, text: string | null | undefined) =>
  text ? `\n(${label}: ${quoteText(text.trim().replace(/\s+/g, " ").slice(0, NEIGHBOUR_CHARS))})` : "";

/** Snippets are numbered from 1 in the prompt, each with its date and the turns around it. */
export function formatSnippets(snippets: RerankInput["snippets"]): string {
  return snippets
    .map(
      (s, i) =>
        `[${i + 1}] (${s.occurredAt.toISOString().slice(0, 10)})${neighbour("just before", s.before)}\n${quoteText(s.text)}${neighbour("just after", s.after)}`,
    )
    .join("\n\n");
}

/** The recall re-ranker: scores each candidate snippet 0–3 for the new message. */
export function createRerankChain(model: ChatModel): Runnable<RerankInput, RerankScores> {
  return jsonAnswerChain({
    prompt: rerankPrompt,
    model,
    variables: (input: RerankInput) => ({ message: quoteText(input.message), snippets: formatSnippets(input.snippets) }),
    answer,
    result: ({ scores }, input) => {
      // Unscored snippets count as 0; numbers the model invents are ignored.
      const result: RerankScores = input.snippets.map(() => 0);
      for (const s of scores) if (s.id >= 1 && s.id <= input.snippets.length) result[s.id - 1] = s.score as 0 | 1 | 2 | 3;
      return result;
    },
  });
}
