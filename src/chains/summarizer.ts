import type { Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/metered.ts";
import { jsonAnswerChain } from "./json.ts";
import { summarizerPrompt } from "./summarizer.prompt.ts";
import { countWords, formatTranscript, quoteSummary, type TranscriptMessage } from "./transcript.ts";

export type SummarizerInput = {
  previousSummary: string | null;
  messages: TranscriptMessage[];
  wordLimit: number;
};

const answer = z.object({ summary: z.string().trim().min(1) });

/** Cuts a summary that runs over the limit at the last whole word within it. */
export function limitWords(text: string, wordLimit: number): string {
  if (countWords(text) <= wordLimit) return text;
  return text.trim().split(/\s+/).slice(0, wordLimit).join(" ");
}

/** Previous summary + newly folded messages in, a summary of at most wordLimit words out. */
export function createSummarizerChain(model: ChatModel): Runnable<SummarizerInput, string> {
  return jsonAnswerChain({
    prompt: summarizerPrompt,
    model,
    variables: (input: SummarizerInput) => ({
      previousSummary: quoteSummary(input.previousSummary),
      messages: formatTranscript(input.messages),
      wordLimit: String(input.wordLimit),
    }),
    answer,
    result: (parsed) => parsed.summary,
  });
}
