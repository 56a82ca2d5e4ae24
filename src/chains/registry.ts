import type { Runnable } from "@langchain/core/runnables";
import type { ChatModel, ChatRole } from "../models/metered.ts";
import { createCompactorChain } from "./compactor.ts";
import { createExtractorChain } from "./extractor.ts";
import { createFactJudgeChain } from "./fact-judge.ts";
import { createLossJudgeChain } from "./loss-judge.ts";
import { createRerankChain } from "./rerank.ts";
import { createSummarizerChain } from "./summarizer.ts";
import { createTriageChain } from "./triage.ts";
import { createVerbatimJudgeChain } from "./verbatim-judge.ts";

/**
 * Every chain Engram runs, by name. The name is the chain's LangChain runName, the `chain` its
 * model usage is recorded under, and the X-Engram-Chain header its model requests carry. The
 * role picks the tenant's model route. A new chain goes here, beside its factory and prompt.
 */
export const chains = {
  summary: { role: "cheap", create: createSummarizerChain },
  "loss-judge": { role: "cheap", create: createLossJudgeChain },
  "verbatim-judge": { role: "cheap", create: createVerbatimJudgeChain },
  triage: { role: "cheap", create: createTriageChain },
  extract: { role: "cheap", create: createExtractorChain },
  "fact-judge": { role: "cheap", create: createFactJudgeChain },
  rerank: { role: "cheap", create: createRerankChain },
  compactor: { role: "compaction", create: createCompactorChain },
} as const satisfies Record<string, { role: ChatRole; create: (model: ChatModel) => Runnable }>;

export type ChainName = keyof typeof chains;
/** The runnable a chain's factory returns: typed input, typed output. */
export type ChainOf<N extends ChainName> = ReturnType<(typeof chains)[N]["create"]>;

/** What chainFor needs of the model provider (structural, so registry and provider do not import each other). */
export type ChatModels = {
  chat(tenantId: string, role: ChatRole, chain: ChainName): Promise<ChatModel | null>;
};

/** The chain on the given model, under its registered name. */
export function buildChain<N extends ChainName>(name: N, model: ChatModel): ChainOf<N> {
  const chain: Runnable = chains[name].create(model);
  return chain.withConfig({ runName: name }) as ChainOf<N>;
}

/**
 * The tenant's chain: its model for the chain's role (budgeted, redacted, metered under the
 * chain's name), or null when no model is configured for that role, so the feature is off.
 */
export async function chainFor<N extends ChainName>(models: ChatModels, tenantId: string, name: N): Promise<ChainOf<N> | null> {
  const model = await models.chat(tenantId, chains[name].role, name);
  return model ? buildChain(name, model) : null;
}
