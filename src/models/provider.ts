import type { BaseChatModel } from "@langchain/core/language_models/chat_models";
import { forTenant, type Db } from "../db.ts";
import type { Env } from "../env.ts";
import { recordModelUsage } from "../memory/usage.ts";
import {
  defaultRoute,
  meteredModel,
  openAIChatModel,
  type ChatModel,
  type ModelRole,
  type ModelRoute,
} from "./index.ts";

/** Hands chains their model for a tenant and role, metered per tenant; null when none is set. */
export type ModelProvider = {
  chat(tenantId: string, role: ModelRole, chain: string): Promise<ChatModel | null>;
};

export function createModelProvider(deps: {
  db: Db;
  env: Env;
  /** Tests pass a scripted model here; production builds ChatOpenAI from the route. */
  createModel?: (route: ModelRoute) => BaseChatModel;
}): ModelProvider {
  const { db, env } = deps;
  const createModel =
    deps.createModel ??
    ((route: ModelRoute) =>
      openAIChatModel(route, {
        timeoutMs: env.ENGRAM_MODEL_TIMEOUT_MS,
        maxRetries: env.ENGRAM_MODEL_MAX_RETRIES,
      }));
  return {
    async chat(tenantId, role, chain) {
      const route = defaultRoute(env, role);
      if (!route) return null;
      const tenantDb = forTenant(db, tenantId);
      return meteredModel(createModel(route), { chain, model: route.model }, (usage) =>
        recordModelUsage(tenantDb, usage),
      );
    },
  };
}
