import type { BaseChatModel } from "@langchain/core/language_models/chat_models";
import type { BaseLanguageModelInput } from "@langchain/core/language_models/base";
import type { AIMessage, BaseMessage } from "@langchain/core/messages";
import { RunnableLambda, type Runnable } from "@langchain/core/runnables";
import { ChatOpenAI } from "@langchain/openai";
import type { Env } from "../env.ts";
import { countTokens } from "../memory/tokens.ts";

/** What a chain is given: a chat model, already metered (and later redacted) for its tenant. */
export type ChatModel = Runnable<BaseLanguageModelInput, AIMessage>;

export type ModelRole = "cheap" | "compaction";

export type ModelRoute = { baseUrl?: string; model: string; apiKey?: string };

export type ModelUsageRecord = {
  chain: string;
  model: string;
  inputTokens: number;
  outputTokens: number;
};

/** The server-wide defaults from the environment; per-tenant routing may override them. */
export function defaultRoute(env: Env, role: ModelRole): ModelRoute | null {
  if (!env.OPENAI_API_KEY && !env.OPENAI_BASE_URL) return null;
  return {
    baseUrl: env.OPENAI_BASE_URL,
    apiKey: env.OPENAI_API_KEY,
    model: role === "compaction" ? env.ENGRAM_COMPACTION_MODEL : env.ENGRAM_CHEAP_MODEL,
  };
}

export function openAIChatModel(
  route: ModelRoute,
  options: { timeoutMs: number; maxRetries: number },
): BaseChatModel {
  return new ChatOpenAI({
    model: route.model,
    // OpenAI-compatible local servers often need no key; the client insists on one.
    apiKey: route.apiKey ?? "not-needed",
    configuration: route.baseUrl ? { baseURL: route.baseUrl } : undefined,
    timeout: options.timeoutMs,
    maxRetries: options.maxRetries,
    temperature: 0,
  });
}

function messageText(message: BaseMessage): string {
  return typeof message.content === "string" ? message.content : JSON.stringify(message.content);
}

function inputText(input: BaseLanguageModelInput): string {
  if (typeof input === "string") return input;
  if (Array.isArray(input)) {
    return input.map((m) => (typeof m === "string" ? m : messageText(m as BaseMessage))).join("\n");
  }
  return input.toChatMessages().map(messageText).join("\n");
}

/**
 * Wraps a chat model so every call is accounted: provider-reported token usage when there is
 * one, else the tokenizer's count of what was sent and received.
 */
export function meteredModel(
  model: BaseChatModel,
  meta: { chain: string; model: string },
  record: (usage: ModelUsageRecord) => Promise<void>,
): ChatModel {
  return RunnableLambda.from(async (input: BaseLanguageModelInput, config) => {
    const output = (await model.invoke(input, config)) as AIMessage;
    const usage = output.usage_metadata;
    await record({
      ...meta,
      inputTokens: usage?.input_tokens ?? countTokens(inputText(input)),
      outputTokens: usage?.output_tokens ?? countTokens(messageText(output)),
    });
    return output;
  }).withConfig({ runName: `memory:${meta.model}` });
}
