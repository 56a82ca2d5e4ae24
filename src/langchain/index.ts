import type { CallbackManagerForRetrieverRun } from "@langchain/core/callbacks/manager";
import { BaseListChatMessageHistory } from "@langchain/core/chat_history";
import { Document } from "@langchain/core/documents";
import { AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage } from "@langchain/core/messages";
import { BaseRetriever, type BaseRetrieverInput } from "@langchain/core/retrievers";
import { RunnableLambda, type Runnable, type RunnableConfig } from "@langchain/core/runnables";
import { EngramError, memoryText, type EngramClient, type GateVerdict } from "../client/index.ts";

/** Who is talking, in your own ids (Engram creates the agent, user and conversation on first use). */
export type EngramConversation = {
  client: EngramClient;
  agent: string;
  endUser: string;
  conversation: string;
};

const textOf = (message: BaseMessage): string => message.text;

/**
 * A conversation's messages, stored in Engram as turns: a human message is held until the AI
 * message that answers it, and the two are recorded as one turn (so summaries, facts and recall
 * follow). `getMessages()` returns the shared messages Engram holds, newest `lastMessages`.
 */
export class EngramChatMessageHistory extends BaseListChatMessageHistory {
  lc_namespace = ["engram", "chat_history"];
  /**
   * The human message waiting for its reply, with the turn id it will be recorded under: made
   * when the message arrives and kept until the turn is stored, so a write retried after a lost
   * answer (a timeout) is the same turn, never a second one.
   */
  private pending?: { text: string; clientTurnId: string };

  constructor(private readonly options: EngramConversation & { lastMessages?: number }) {
    super();
  }

  async getMessages(): Promise<BaseMessage[]> {
    const conversation = await this.options.client.conversation(this.options.conversation, {
      lastMessages: this.options.lastMessages ?? 100,
    });
    const stored = (conversation?.messages.edges ?? []).map(({ node }) => {
      if (node.role === "USER") return new HumanMessage(node.content);
      if (node.role === "ASSISTANT") return new AIMessage(node.content);
      if (node.role === "TOOL") return new ToolMessage({ content: node.content, tool_call_id: `engram-${node.seq}` });
      return new SystemMessage(node.content);
    });
    return this.pending === undefined ? stored : [...stored, new HumanMessage(this.pending.text)];
  }

  async addMessage(message: BaseMessage): Promise<void> {
    const type = message.getType();
    if (type === "human") {
      // Two human messages in a row: the first is a turn with no reply.
      if (this.pending !== undefined) await this.record(this.pending);
      this.pending = { text: textOf(message), clientTurnId: globalThis.crypto.randomUUID() };
    } else if (type === "ai") {
      if (this.pending === undefined) {
        throw new EngramError("BAD_USER_INPUT", "Engram records turns: add the human message before the AI message that answers it.");
      }
      // Kept until the turn is stored: a refused or failed write loses neither message.
      await this.record(this.pending, textOf(message));
      this.pending = undefined;
    }
    // System and tool messages are the agent's own prompt and steps, not the conversation.
  }

  async addMessages(messages: BaseMessage[]): Promise<void> {
    for (const message of messages) await this.addMessage(message);
  }

  /** Deletes the conversation in Engram (messages, summaries, recall data). */
  async clear(): Promise<void> {
    this.pending = undefined;
    const conversation = await this.options.client.conversation(this.options.conversation, { lastMessages: 1 });
    if (conversation) await this.options.client.deleteConversation(conversation.id);
  }

  private async record(pending: { text: string; clientTurnId: string }, assistantMessage?: string) {
    const { client, agent, endUser, conversation } = this.options;
    await client.recordTurn({
      agentExternalId: agent,
      endUserExternalId: endUser,
      conversationExternalId: conversation,
      clientTurnId: pending.clientTurnId,
      userMessage: pending.text,
      // An answer with no text (a tool call alone) is a turn with no reply, not an empty one.
      assistantMessage: assistantMessage || undefined,
    });
  }
}

export type EngramRetrieverInput = BaseRetrieverInput & {
  client: EngramClient;
  /** Your id for the end user. */
  endUser?: string;
  /** Engram's id of the end user. */
  endUserId?: string;
  /** Your id of the current conversation: its user is searched, the conversation itself left out. */
  conversation?: string;
  /** Candidates to return, default 3. */
  k?: number;
};

/**
 * Snippets of the user's earlier conversations, ranked by Engram's recall (vector + keyword),
 * as Documents with the scores in their metadata.
 */
export class EngramRetriever extends BaseRetriever {
  lc_namespace = ["engram", "retrievers"];
  private readonly input: EngramRetrieverInput;

  constructor(input: EngramRetrieverInput) {
    super(input);
    if (!input.endUser && !input.endUserId && !input.conversation) {
      throw new EngramError("BAD_USER_INPUT", "EngramRetriever needs endUser, endUserId or conversation.");
    }
    this.input = input;
  }

  async _getRelevantDocuments(query: string, runManager?: CallbackManagerForRetrieverRun): Promise<Document[]> {
    void runManager;
    const { client, conversation, k = 3 } = this.input;
    let endUserId = this.input.endUserId;
    let excludeConversationId: string | undefined;
    if (!endUserId && this.input.endUser) {
      endUserId = (await client.endUser(this.input.endUser))?.id;
      if (!endUserId) return [];
    }
    if (conversation) {
      const found = await client.conversation(conversation, { lastMessages: 1 });
      if (!found) return [];
      endUserId ??= found.endUser.id;
      excludeConversationId = found.id;
    }
    const { candidates } = await client.recall({ endUserId: endUserId!, text: query, k, excludeConversationId });
    return candidates.map(
      (candidate) =>
        new Document({
          id: candidate.snippetId,
          pageContent: candidate.text,
          metadata: {
            source: "engram",
            kind: candidate.kind,
            conversationId: candidate.conversationId,
            occurredAt: candidate.occurredAt,
            fusedScore: candidate.fusedScore,
            vectorScore: candidate.vectorScore,
            keywordScore: candidate.keywordScore,
          },
        }),
    );
  }
}

/** A chat model's answer, or a chain's: what gets recorded as the assistant's message. */
type Answer = BaseMessage | string;
const answerText = (answer: Answer): string => (typeof answer === "string" ? answer : textOf(answer));

/**
 * The gate verdict of a model bound with Engram's gate as a tool (gateInstructions' toolName
 * and jsonSchema): the arguments of that tool call, or undefined when the model made none.
 * Pass it as `gateVerdict` to withEngramMemory.
 */
export function gateVerdictFromToolCall(answer: Answer, toolName = "engram_gate"): GateVerdict | undefined {
  if (typeof answer === "string" || !AIMessage.isInstance(answer)) return undefined;
  return answer.tool_calls?.find((call) => call.name === toolName)?.args as GateVerdict | undefined;
}

export type EngramMemoryOptions = EngramConversation & {
  /** Your agent's own instructions, put before the memory. */
  system?: string;
  /**
   * Reads the gate verdict out of the model's answer, when your call asked for one (Engram's
   * gateInstructions); it is handed to recordTurn as `gate`, so Engram needs no gate call.
   */
  gateVerdict?: (answer: Answer) => GateVerdict | null | undefined;
};

/** The input of a wrapped runnable: the user's message, or prompt variables with it as `input`. */
export type EngramMemoryInput = string | ({ input: string } & Record<string, unknown>);

/**
 * Gives a chat model (or a chain) Engram's memory. Before the call it asks `context` for the
 * user's message and puts the blocks in the prompt; after it records the turn.
 * - A string input calls the runnable with [system: instructions + memory, human: message].
 * - An object input `{ input, ...variables }` calls it with `{ ...variables, input, memory }`,
 *   for prompt templates that place `{memory}` themselves.
 */
export function withEngramMemory<Output extends Answer>(
  runnable: Runnable<any, Output>,
  options: EngramMemoryOptions,
): Runnable<EngramMemoryInput, Output> {
  const { client, agent, endUser, conversation } = options;
  let conversationId: string | undefined;
  return RunnableLambda.from(async (input: EngramMemoryInput, config?: RunnableConfig): Promise<Output> => {
    const message = typeof input === "string" ? input : input.input;
    // By our own ids, a conversation's first turn already gets the user's facts and recall.
    const context = await client.context(
      conversationId ? { conversationId, message } : { agentExternalId: agent, endUserExternalId: endUser, conversationExternalId: conversation, message },
    );
    const memory = memoryText(context.blocks);

    const system = [options.system, memory && `What you remember:\n\n${memory}`].filter(Boolean).join("\n\n");
    const prompt =
      typeof input === "string"
        ? [...(system ? [new SystemMessage(system)] : []), new HumanMessage(message)]
        : { ...input, memory };
    const answer = await runnable.invoke(prompt, config);

    const gate = options.gateVerdict?.(answer);
    const turn = await client.recordTurn({
      agentExternalId: agent,
      endUserExternalId: endUser,
      conversationExternalId: conversation,
      userMessage: message,
      assistantMessage: answerText(answer) || undefined,
      gate: gate ?? null,
    });
    conversationId = turn.conversation.id;
    return answer;
  }).withConfig({ runName: "EngramMemory" }) as unknown as Runnable<EngramMemoryInput, Output>;
}
