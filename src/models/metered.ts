import type { BaseChatModel } from "@langchain/core/language_models/chat_models";
import type { BaseLanguageModelInput } from "@langchain/core/language_models/base";
import {
  AIMessage,
  ChatMessage,
  HumanMessage,
  SystemMessage,
  ToolMessage,
  coerceMessageLikeToMessage,
  type BaseMessage,
  type MessageContent,
} from "@langchain/core/messages";
import { RunnableLambda, type Runnable } from "@langchain/core/runnables";
import { ChatOpenAI } from "@langchain/openai";
import type { Env } from "../env.ts";
import type { RedactionResult } from "../governance/redaction.ts";
import { defaultModelName, serverRoutes, type ModelRole } from "../governance/settings.ts";

export { defaultModelName };
import { countTokens } from "../memory/tokens.ts";
import { quoteLiteral } from "../chains/transcript.ts";
import { asModelCallError, noteExchanges, unansweredRequests, withinDeadline, type Exchanges } from "./egress.ts";

/** What a chain is given: a chat model, already budgeted, redacted and metered for its tenant. */
export type ChatModel = Runnable<BaseLanguageModelInput, AIMessage>;

export type { ModelRole };
/** The roles a chat model is asked for; embeddings have their own route. */
export type ChatRole = Exclude<ModelRole, "embedding">;

export type ModelRoute = { baseUrl?: string; model: string; apiKey?: string };

export type ModelUsageRecord = {
  chain: string;
  model: string;
  inputTokens: number;
  outputTokens: number;
  redactions?: number;
};

/** The server-wide defaults from the environment; per-tenant routing may override them. */
export function defaultRoute(env: Env, role: ModelRole): ModelRoute | null {
  if (!serverRoutes(env, role)) return null;
  return { baseUrl: env.OPENAI_BASE_URL, apiKey: env.OPENAI_API_KEY, model: defaultModelName(env, role) };
}

/**
 * The header every chat request carries with the name of the chain that sent it. A header, not
 * a body field: OpenAI's `user` means the end user (abuse monitoring) and `metadata` is for
 * stored completions, and strict OpenAI-compatible servers reject unknown body fields, while
 * every server ignores a header it does not know. Proxies can log or route on it; the scripted
 * test model routes on it.
 */
export const CHAIN_HEADER = "X-Engram-Chain";

export function openAIChatModel(
  route: ModelRoute,
  options: { timeoutMs: number; maxRetries: number; chain: string; fetch?: typeof fetch },
): BaseChatModel {
  return new ChatOpenAI({
    model: route.model,
    // OpenAI-compatible local servers often need no key; the client insists on one.
    apiKey: route.apiKey ?? "not-needed",
    configuration: { baseURL: route.baseUrl, defaultHeaders: { [CHAIN_HEADER]: options.chain }, fetch: options.fetch },
    timeout: options.timeoutMs,
    maxRetries: options.maxRetries,
    temperature: 0,
  });
}

function messageText(message: BaseMessage): string {
  return typeof message.content === "string" ? message.content : JSON.stringify(message.content);
}

function toMessages(input: BaseLanguageModelInput): BaseMessage[] {
  if (typeof input === "string") return [new HumanMessage(input)];
  if (Array.isArray(input)) return input.map((m) => coerceMessageLikeToMessage(m));
  return input.toChatMessages();
}

/** The text parts of a message's content, in order, and a way to put redacted ones back. */
function textParts(content: MessageContent): { texts: string[]; rebuild(texts: string[]): MessageContent } {
  if (typeof content === "string") return { texts: [content], rebuild: ([text]) => text };
  const indexes = content.flatMap((part, i) => (part.type === "text" && typeof part.text === "string" ? [i] : []));
  return {
    texts: indexes.map((i) => (content[i] as unknown as { text: string }).text),
    rebuild: (texts) => content.map((part, i) => (indexes.includes(i) ? { ...part, text: texts[indexes.indexOf(i)] } : part)) as MessageContent,
  };
}

function withContent(message: BaseMessage, content: MessageContent): BaseMessage {
  const fields = { content, name: message.name, additional_kwargs: message.additional_kwargs };
  switch (message.getType()) {
    case "system":
      return new SystemMessage(fields);
    case "human":
      return new HumanMessage(fields);
    case "ai":
      return new AIMessage({ ...fields, tool_calls: (message as AIMessage).tool_calls });
    case "tool":
      return new ToolMessage({ ...fields, tool_call_id: (message as ToolMessage).tool_call_id });
    default:
      return new ChatMessage({ ...fields, role: (message as ChatMessage).role ?? message.getType() });
  }
}

/** Every text a prompt sends, redacted by the tenant's rules; the caller's input is not changed. */
export async function redactPrompt(
  input: BaseLanguageModelInput,
  redact: (texts: string[]) => Promise<RedactionResult>,
): Promise<{ messages: BaseMessage[]; redactions: number }> {
  const messages = toMessages(input);
  const parts = messages.map((m) => textParts(m.content));
  const pieces = parts.map((p) => p.texts.map(quotedPieces));
  const { texts, redactions } = await redact(pieces.flatMap((own) => own.flatMap((p) => p.texts)));
  let offset = 0;
  const redacted = messages.map((message, i) => {
    const own = pieces[i].map((p) => p.rebuild(texts.slice(offset, (offset += p.texts.length))));
    return withContent(message, parts[i].rebuild(own));
  });
  return { messages: redacted, redactions };
}

// A JSON string literal on one line, as the chains quote user text (chains/transcript.ts).
const QUOTED = /"(?:[^"\\\n]|\\.)*"/g;

/**
 * A prompt's text cut into its plain stretches and its quoted literals, decoded: inside a literal a
 * secret that starts a line follows "\n", whose letter defeats the rules' word boundaries. A
 * literal the rules change is quoted again; one they leave is put back as it was.
 */
function quotedPieces(text: string): { texts: string[]; rebuild(texts: string[]): string } {
  const texts: string[] = [];
  const literals = new Map<number, string>();
  let plainFrom = 0;
  for (const match of text.matchAll(QUOTED)) {
    let decoded: unknown;
    try {
      decoded = JSON.parse(match[0]);
    } catch {
      continue; // not a literal after all: it stays in the plain stretch
    }
    texts.push(text.slice(plainFrom, match.index));
    literals.set(texts.length, match[0]);
    texts.push(decoded as string);
    plainFrom = match.index + match[0].length;
  }
  texts.push(text.slice(plainFrom));
  const decodedTexts = [...texts];
  return {
    texts,
    rebuild: (redacted) =>
      redacted
        .map((piece, i) => {
          const literal = literals.get(i);
          if (literal === undefined) return piece;
          return piece === decodedTexts[i] ? literal : quoteLiteral(piece);
        })
        .join(""),
  };
}

export type MeteringHooks = {
  /** How long the model call may take in all, retries included (modelCallDeadlineMs). */
  deadlineMs: number;
  /**
   * Runs before anything is sent, with a count of the prompt's tokens: throws to refuse the call
   * (the budget), or returns what to run once the call has ended and its usage is recorded
   * (giving back the tokens it held).
   */
  reserve?: (prompt: { inputTokens(): number }) => Promise<(() => Promise<void>) | undefined>;
  /** The tenant's redaction rules, applied to every text sent. */
  redact?: (texts: string[]) => Promise<RedactionResult>;
  record: (usage: ModelUsageRecord) => Promise<void>;
};

/**
 * A provider's token figure, when a usage row can hold it (a whole number from 0 to 2^31 - 1);
 * else undefined and the call is counted by the tokenizer. A tenant's own endpoint reports what it
 * likes: a negative figure lowered what its budget counts as spent, and one past 32 bits failed
 * the usage row after the call was made.
 */
export const reportedTokens = (n: unknown): number | undefined =>
  typeof n === "number" && Number.isInteger(n) && n >= 0 && n < 2 ** 31 ? n : undefined;

/** Records a call that got no answer; a failure to record it leaves the call's own error to tell. */
export async function recordUnanswered(record: MeteringHooks["record"], usage: ModelUsageRecord): Promise<void> {
  await record(usage).catch(() => undefined);
}

const promptTokens = (input: BaseLanguageModelInput) => countTokens(toMessages(input).map(messageText).join("\n"));

/**
 * Wraps a chat model so every call is checked against the tenant's budget, redacted by its rules
 * and accounted: provider-reported token usage when there is one, else the tokenizer's count of
 * what was sent and received. All of it happens at invoke time, so a model handed out before a
 * settings change still obeys the change. The call itself ends by its deadline, answered or not.
 */
export function meteredModel(
  model: BaseChatModel,
  meta: { chain: string; model: string },
  { deadlineMs, reserve, redact, record }: MeteringHooks,
): ChatModel {
  return RunnableLambda.from(async (input: BaseLanguageModelInput, config) => {
    // Counted on the prompt before redaction, so a refused call costs no redaction run; the
    // placeholders are about as long as what they replace.
    const release = await reserve?.({ inputTokens: () => promptTokens(input) });
    try {
      let sent = input;
      let redactions = 0;
      if (redact) ({ messages: sent, redactions } = await redactPrompt(input, redact));
      let output: AIMessage;
      const noted: Exchanges = { sent: 0, refused: 0 };
      try {
        output = (await noteExchanges(noted, () =>
          withinDeadline(deadlineMs, (signal) => model.invoke(sent, { ...config, signal }), config?.signal),
        )) as AIMessage;
      } catch (error) {
        // A provider that read the prompt but never answered whole may bill it: counted (its
        // output unknown, so 0), or a slow or stalled provider could be called past any budget.
        // Every try so sent counts (ENGRAM_MODEL_MAX_RETRIES of them could stall), as on an answered call.
        const unanswered = unansweredRequests(noted);
        if (unanswered) await recordUnanswered(record, { ...meta, inputTokens: unanswered * promptTokens(sent), outputTokens: 0, redactions });
        // Only a short reason goes on: a provider's error body can hold what it should not show.
        throw asModelCallError(error);
      }
      const usage = output.usage_metadata;
      // Tries before the answered one that were sent and got no answer may be billed too (each the same prompt).
      const unansweredTries = Math.max(0, unansweredRequests(noted) - 1);
      await record({
        ...meta,
        inputTokens: (reportedTokens(usage?.input_tokens) ?? promptTokens(sent)) + (unansweredTries ? unansweredTries * promptTokens(sent) : 0),
        outputTokens: reportedTokens(usage?.output_tokens) ?? countTokens(messageText(output)),
        redactions,
      });
      return output;
    } finally {
      await release?.();
    }
  }).withConfig({ runName: `memory:${meta.model}` });
}
