import { StringOutputParser } from "@langchain/core/output_parsers";
import { RunnableLambda, type Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/index.ts";
import { factJudgePrompt } from "./fact-judge.prompt.ts";
import { parseJsonAnswer } from "./json.ts";

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
  relatedFactId: z.string().trim().nullish(),
  sensitivity: z
    .string()
    .trim()
    .nullish()
    .transform((v) => (!v || v.toLowerCase() === "none" ? null : v.toLowerCase())),
});

/** Durability, relation to what is stored, and sensitivity of one candidate fact. */
export function createFactJudgeChain(model: ChatModel): Runnable<FactJudgeInput, FactJudgment> {
  return RunnableLambda.from((input: FactJudgeInput) => ({
    stored: input.stored.length ? input.stored.map((f) => `[${f.id}] ${f.text}`).join("\n") : "(none)",
    candidate: input.candidate,
  }))
    .pipe(factJudgePrompt)
    .pipe(model)
    .pipe(new StringOutputParser())
    .pipe(
      RunnableLambda.from((text: string): FactJudgment => {
        const judged = parseJsonAnswer(text, answer);
        const relation = judged.relation;
        return {
          durability: judged.durability,
          relation,
          relatedFactId: relation === "none" ? null : (judged.relatedFactId ?? null),
          sensitivity: judged.sensitivity ?? null,
        };
      }),
    )
    .withConfig({ runName: "fact-judge" });
}
