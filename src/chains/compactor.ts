import type { Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/metered.ts";
import { jsonAnswerChain } from "./json.ts";
import { compactorPrompt, formatEvents, type CompactorEvent } from "./compactor.prompt.ts";

export type CompactorInput = { scope: string; scopeRef: string; events: CompactorEvent[] };

const compactedEntry = z.object({
  title: z
    .string()
    .trim()
    .min(1)
    .transform((title) => title.split("\n")[0].slice(0, 200)),
  summary: z.string().trim().min(1),
  tags: z
    .array(z.string().trim().toLowerCase().min(1).max(64))
    .default([])
    .transform((tags) => [...new Set(tags)].slice(0, 32)),
});

export type CompactedEntry = z.infer<typeof compactedEntry>;

/** Events of one (scope, scopeRef) bucket in, one curated entry out. */
export function createCompactorChain(model: ChatModel): Runnable<CompactorInput, CompactedEntry> {
  return jsonAnswerChain({
    prompt: compactorPrompt,
    model,
    variables: (input: CompactorInput) => ({
      scope: input.scope,
      scopeRef: input.scopeRef,
      count: String(input.events.length),
      events: formatEvents(input.events),
    }),
    answer: compactedEntry,
  });
}
