import { Embeddings } from "@langchain/core/embeddings";
import { RunnableLambda } from "@langchain/core/runnables";
import type { EmbeddingsProvider } from "../embeddings/index.ts";
import { EngramError } from "../errors.ts";
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
  ) {
    super({});
  }

  async embedDocuments(documents: string[]): Promise<number[][]> {
    this.budget.spend("embedding");
    return this.inner.embedDocuments(documents);
  }

  async embedQuery(document: string): Promise<number[]> {
    this.budget.spend("embedding");
    return this.inner.embedQuery(document);
  }
}

const budgetedChat = (model: ChatModel, budget: ModelCallBudget): ChatModel =>
  RunnableLambda.from(async (input: Parameters<ChatModel["invoke"]>[0], config) => {
    budget.spend("chat");
    return model.invoke(input, config);
  });

/**
 * The request's view of the models: every chat call and every embedding call (a batch is one
 * call) spends from its budget, whichever field makes it. Jobs use the unbudgeted providers.
 */
export function withModelCallBudget<D extends { models: ModelProvider; embeddings: EmbeddingsProvider }>(deps: D, budget: ModelCallBudget): D {
  const { models, embeddings } = deps;
  return {
    ...deps,
    models: {
      ...models,
      chat: async (tenantId, role, chain) => {
        const model = await models.chat(tenantId, role, chain);
        return model && budgetedChat(model, budget);
      },
    },
    embeddings: {
      ...embeddings,
      forTenant: async (tenantId) => {
        const own = await embeddings.forTenant(tenantId);
        return { ...own, embeddings: new BudgetedEmbeddings(own.embeddings, budget) };
      },
    },
  };
}
