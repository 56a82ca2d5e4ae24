import type { Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/metered.ts";
import { gatePrompt } from "./gate.prompt.ts";
import { jsonAnswerChain, modelBoolean as bool } from "./json.ts";

export type GateVerdict = {
  remember: boolean;
  forget: "NONE" | "SOME" | "ALL";
  forgetTargets: string[];
  needsRecall: boolean;
};

const answer = z.object({
  remember: bool,
  forget: z
    .string()
    .transform((v) => v.toUpperCase())
    .pipe(z.enum(["NONE", "SOME", "ALL"])),
  forgetTargets: z.array(z.string().trim().min(1).max(200)).max(20).default([]),
  needsRecall: bool,
});

/** One cheap call per turn answers every gate: remember?, forget what?, needs earlier conversations? */
export function createGateChain(model: ChatModel): Runnable<{ message: string }, GateVerdict> {
  return jsonAnswerChain({
    name: "gate",
    prompt: gatePrompt,
    model,
    variables: (input: { message: string }) => ({ message: input.message }),
    answer,
    result: (verdict): GateVerdict =>
      verdict.forget === "SOME" && verdict.forgetTargets.length === 0 ? { ...verdict, forget: "NONE" } : verdict,
  });
}
