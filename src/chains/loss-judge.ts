import type { Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/metered.ts";
import { jsonAnswerChain, modelBoolean } from "./json.ts";
import { lossJudgePrompt } from "./loss-judge.prompt.ts";
import { formatTranscript, quoteSummary, type TranscriptMessage } from "./transcript.ts";

export type LossJudgeInput = {
  previousSummary: string | null;
  newSummary: string;
  messages: TranscriptMessage[];
};

export type LossVerdict = { lost: boolean; reason: string };

const verdict = z.object({
  lost: modelBoolean,
  reason: z.string().trim().default(""),
});

/** Did the rewrite lose something the user said? */
export function createLossJudgeChain(model: ChatModel): Runnable<LossJudgeInput, LossVerdict> {
  return jsonAnswerChain({
    prompt: lossJudgePrompt,
    model,
    variables: (input: LossJudgeInput) => ({
      previousSummary: quoteSummary(input.previousSummary),
      newSummary: quoteSummary(input.newSummary),
      messages: formatTranscript(input.messages),
    }),
    answer: verdict,
  });
}
