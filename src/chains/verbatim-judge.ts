import { StringOutputParser } from "@langchain/core/output_parsers";
import { RunnableLambda, type Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/index.ts";
import { parseJsonAnswer } from "./json.ts";
import { formatTranscript, type TranscriptMessage } from "./transcript.ts";
import { verbatimJudgePrompt } from "./verbatim-judge.prompt.ts";

export type VerbatimJudgeInput = {
  summary: string | null;
  older: TranscriptMessage[];
  recent: TranscriptMessage[];
};

/** Scores 0 noise, 1 background, 2 useful, 3 essential, by message sequence number. */
export type VerbatimScores = Map<number, 0 | 1 | 2 | 3>;

// Numbers, or numbers written as strings; null, booleans and empty strings are broken answers.
const integer = z.union([z.number(), z.string().regex(/^\d+$/).transform(Number)]).pipe(z.number().int());

const answer = z.object({
  scores: z.array(z.object({ seq: integer, score: integer.pipe(z.number().min(0).max(3)) })),
});

export function createVerbatimJudgeChain(model: ChatModel): Runnable<VerbatimJudgeInput, VerbatimScores> {
  return RunnableLambda.from((input: VerbatimJudgeInput) => ({
    summary: input.summary?.trim() || "(none yet)",
    older: formatTranscript(input.older),
    recent: formatTranscript(input.recent),
  }))
    .pipe(verbatimJudgePrompt)
    .pipe(model)
    .pipe(new StringOutputParser())
    .pipe(
      RunnableLambda.from((text: string) => {
        const { scores } = parseJsonAnswer(text, answer);
        // Only messages that were asked about count; anything else the model invents is ignored.
        return new Map(scores.map((s) => [s.seq, s.score as 0 | 1 | 2 | 3]));
      }),
    )
    .withConfig({ runName: "verbatim-judge" });
}
