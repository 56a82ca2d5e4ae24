import type { Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/metered.ts";
import { jsonAnswerChain, modelBoolean as bool } from "./json.ts";
import { triagePrompt } from "./triage.prompt.ts";

/** What the triage model (or, without one, the keyword gate) says about one user message. */
export type TriageVerdict = {
  remember: boolean;
  forget: "NONE" | "SOME" | "ALL";
  forgetTargets: string[];
  needsRecall: boolean;
};

export type TriageInput = { message: string };

const answer = z.object({
  remember: bool,
  forget: z
    .string()
    .transform((v) => v.toUpperCase())
    .pipe(z.enum(["NONE", "SOME", "ALL"])),
  forgetTargets: z.array(z.string().trim().min(1).max(200)).max(20).default([]),
  needsRecall: bool,
});

/** One cheap call per turn answers the gate's three questions: remember?, forget what?, needs earlier conversations? */
export function createTriageChain(model: ChatModel): Runnable<TriageInput, TriageVerdict> {
  return jsonAnswerChain({
    prompt: triagePrompt,
    model,
    variables: (input: TriageInput) => ({ message: input.message }),
    answer,
    result: (verdict): TriageVerdict =>
      verdict.forget === "SOME" && verdict.forgetTargets.length === 0 ? { ...verdict, forget: "NONE" } : verdict,
  });
}
