import type { Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/metered.ts";
import { extractorPrompt } from "./extractor.prompt.ts";
import { jsonAnswerChain, modelBoolean } from "./json.ts";
import { formatTranscript, type TranscriptMessage } from "./transcript.ts";

export type ExtractorInput = { known: string[]; messages: TranscriptMessage[] };
export type CandidateFact = { text: string; core: boolean; seq: number | null };

const answer = z.object({
  facts: z.array(
    z.object({
      text: z.string().trim().min(3).max(500),
      core: modelBoolean.default(false),
      seq: z.coerce.number().int().nullish(),
    }),
  ),
});

/** A batch of shared messages and what is already known in, candidate facts out. */
export function createExtractorChain(model: ChatModel): Runnable<ExtractorInput, CandidateFact[]> {
  return jsonAnswerChain({
    prompt: extractorPrompt,
    model,
    variables: (input: ExtractorInput) => ({
      known: input.known.length ? input.known.map((f) => `- ${f}`).join("\n") : "(nothing yet)",
      messages: formatTranscript(input.messages),
    }),
    answer,
    result: ({ facts }) => facts.map((f) => ({ text: f.text, core: f.core, seq: f.seq ?? null })),
  });
}
