import type { Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/metered.ts";
import { factJudgePrompt } from "./fact-judge.prompt.ts";
import { jsonAnswerChain } from "./json.ts";
import { quoteText } from "./transcript.ts";

export type FactJudgeInput = { candidate: string; stored: { id: string; text: string }[] };

export type FactJudgment = {
  durability: "durable" | "situational" | "noise";
  relation: "none" | "same" | "update" | "contradiction";
  relatedFactId: string | null;
  /** null when the fact is not sensitive */
  sensitivity: string | null;
};

const answer = z.object({
  durability: z.string().trim().toLowerCase().pipe(z.enum(["durable", "situational", "noise"])),
  relation: z.string().trim().toLowerCase().pipe(z.enum(["none", "same", "update", "contradiction"])),
  // The prompt lists stored facts as "[id] text", so a model often answers the id in its brackets.
  relatedFactId: z
    .string()
    .trim()
    .nullish()
    .transform((v) => v?.replace(/^\[\s*(.*?)\s*\]$/, "$1") || null),
  sensitivity: z
    .string()
    .trim()
    .nullish()
    .transform((v) => (!v || v.toLowerCase() === "none" ? null : v.toLowerCase())),
});

/** Durability, relation to what is stored, and sensitivity of one candidate fact. */
export function createFactJudgeChain(model: ChatModel): Runnable<FactJudgeInput, FactJudgment> {
  return jsonAnswerChain({
    prompt: factJudgePrompt,
    model,
    variables: (input: FactJudgeInput) => ({
      stored: input.stored.length ? input.stored.map((f) => `[${f.id}] ${quoteText(f.text)}`).join("\n") : "(none)",
      candidate: quoteText(input.candidate),
    }),
    answer,
    result: (judged): FactJudgment => ({
      durability: judged.durability,
      relation: judged.relation,
      relatedFactId: judged.relation === "none" ? null : (judged.relatedFactId ?? null),
      sensitivity: judged.sensitivity ?? null,
    }),
  });
}
