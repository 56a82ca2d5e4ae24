import type { Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/metered.ts";
import { jsonAnswerChain, modelInteger as integer } from "./json.ts";
import { formatTranscript, quoteSummary, type TranscriptMessage } from "./transcript.ts";
import { verbatimJudgePrompt } from "./verbatim-judge.prompt.ts";

export type VerbatimJudgeInput = {
  summary: string | null;
  older: TranscriptMessage[];
  recent: TranscriptMessage[];
};

/** Scores 0 noise, 1 background, 2 useful, 3 essential, by message sequence number. */
export type VerbatimScores = Map<number, 0 | 1 | 2 | 3>;

const answer = z.object({
  scores: z.array(z.object({ seq: integer, score: integer.pipe(z.number().min(0).max(3)) })),
});

export function createVerbatimJudgeChain(model: ChatModel): Runnable<VerbatimJudgeInput, VerbatimScores> {
  return jsonAnswerChain({
    prompt: verbatimJudgePrompt,
    model,
    variables: (input: VerbatimJudgeInput) => ({
      summary: quoteSummary(input.summary),
      older: formatTranscript(input.older),
      recent: formatTranscript(input.recent),
    }),
    answer,
    // Only messages that were asked about count; anything else the model invents is ignored.
    result: ({ scores }) => new Map(scores.map((s) => [s.seq, s.score as 0 | 1 | 2 | 3])),
  });
}
