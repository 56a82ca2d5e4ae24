import { Embeddings } from "@langchain/core/embeddings";
import { RunnableLambda } from "@langchain/core/runnables";
import type { EmbeddingsProvider } from "../embeddings/index.ts";
import { EngramError } from "../errors.ts";
import { ModelCallError, replySignal, withinDeadline } from "./egress.ts";
import type { ChatModel } from "./metered.ts";
import type { ModelProvider } from "./provider.ts";

/**
 * The model calls one request may still make, shared by all its fields: aliases could otherwise
 * run `context` thirty times in one request, each spending chat and embedding calls.
 */
export type ModelCallBudget = {
  readonly limit: number;
  /** Counts one call, or throws MODEL_CALL_LIMIT before it is made when none is left. */
  spend(kind: "chat" | "embedding"): void;
  used(): number;
};

export function modelCallBudget(limit: number): ModelCallBudget {
  let used = 0;
  return {
    limit,
    spend(kind) {
      if (used >= limit) {
        throw new EngramError(
          "MODEL_CALL_LIMIT",
          `This request used its ${limit} model calls (chat and embeddings, over all its fields); the next ${kind} call was not made. Split the request.`,
          { limit },
        );
      }
      used++;
    },
    used: () => used,
  };
}

/** Whether an error is a request's spent model-call budget: the fallbacks that hide a model's failure must not hide this. */
export const isModelCallLimit = (error: unknown): boolean => error instanceof EngramError && error.code === "MODEL_CALL_LIMIT";

class BudgetedEmbeddings extends Embeddings {
  constructor(
    private readonly inner: Embeddings,
    private readonly budget: ModelCallBudget,
    /** The reply's deadline on a provider's calls; null for the offline encoder, which no network can stall and no signal can stop. */
    private readonly deadline: ReplyDeadline | null,
  ) {
    super({});
  }

  async embedDocuments(documents: string[]): Promise<number[][]> {
    this.budget.spend("embedding");
    if (this.deadline === null) return this.inner.embedDocuments(documents);
    return withinReply(this.deadline, () => this.inner.embedDocuments(documents));
  }

  async embedQuery(document: string): Promise<number[]> {
    this.budget.spend("embedding");
    if (this.deadline === null) return this.inner.embedQuery(document);
    return withinReply(this.deadline, () => this.inner.embedQuery(document));
  }
}

/**
 * The model time one request has in all: `deadlineMs` from its first model call, shared by the
 * calls after it (an embedding then a re-rank judge, both stalled, end together at the deadline
 * rather than one after the other), so a caller's timeout above it always gets the answer.
 */
type ReplyDeadline = { deadlineMs: number; startedAt?: number };

/**
 * A model call a request waits on, ended at the reply's deadline: it then fails as an outage
 * (`context` and `recall` go on without it), and its provider request is torn down; one that
 * would start with no time left is not sent. An embedding hears the abort through `replySignal`
 * (LangChain's Embeddings take no per-call options).
 */
function withinReply<T>(deadline: ReplyDeadline, call: (signal: AbortSignal) => Promise<T>, outer?: AbortSignal): Promise<T> {
  deadline.startedAt ??= Date.now();
  const left = deadline.startedAt + deadline.deadlineMs - Date.now();
  const whose = "for the reply, ENGRAM_REPLY_MODEL_TIMEOUT_MS";
  if (left <= 0) return Promise.reject(new ModelCallError(`not sent: the request's model time is spent (${deadline.deadlineMs} ms ${whose})`));
  return withinDeadline(left, (signal) => replySignal.run(signal, () => call(signal)), outer, whose, deadline.deadlineMs);
}

const chatForRequest = (model: ChatModel, budget: ModelCallBudget, deadline: ReplyDeadline): ChatModel =>
  RunnableLambda.from(async (input: Parameters<ChatModel["invoke"]>[0], config) => {
    budget.spend("chat");
    return withinReply(deadline, (signal) => model.invoke(input, { ...config, signal }), config?.signal);
  });

/**
 * The request's view of the models: every chat call and every embedding call (a batch is one
 * call) spends from its budget, whichever field makes it, and a provider's calls end within
 * `deadlineMs` (ENGRAM_REPLY_MODEL_TIMEOUT_MS) of the first, together, so a stalled provider never
 * holds a reply for a job's whole deadline (the offline encoder runs in process: no deadline). Jobs use the providers
 * as they are.
 */
export function modelsForRequest<D extends { models: ModelProvider; embeddings: EmbeddingsProvider }>(
  deps: D,
  { budget, deadlineMs }: { budget: ModelCallBudget; deadlineMs: number },
): D {
  const { models, embeddings } = deps;
  const deadline: ReplyDeadline = { deadlineMs };
  return {
    ...deps,
    models: {
      ...models,
      chat: async (tenantId, role, chain) => {
        const model = await models.chat(tenantId, role, chain);
        return model && chatForRequest(model, budget, deadline);
      },
    },
    embeddings: {
      ...embeddings,
      forTenant: async (tenantId) => {
        const own = await embeddings.forTenant(tenantId);
        return { ...own, embeddings: new BudgetedEmbeddings(own.embeddings, budget, own.offline ? null : deadline) };
      },
    },
  };
}
