import type { Embeddings } from "@langchain/core/embeddings";
import type { Env } from "../env.ts";
import type { ModelProvider } from "../models/provider.ts";
import { OFFLINE_MODEL, OfflineEmbeddings } from "./offline.ts";

/** A tenant's embedder, with the model name its vectors are filed under. */
export type TenantEmbeddings = {
  embeddings: Embeddings;
  /** Recorded on each snippet and part of the Chroma collection name. */
  model: string;
  /** Cosine similarity below which a snippet is not recalled without the judge. */
  similarityFloor: number;
};

export type EmbeddingsProvider = {
  forTenant(tenantId: string): Promise<TenantEmbeddings>;
  close(): Promise<void>;
};

/** Whether recall embeds through OpenAI (or a compatible base URL) rather than the offline encoder. */
export function usesOpenAIEmbeddings(env: Env): boolean {
  if (env.ENGRAM_EMBEDDINGS === "offline") return false;
  if (env.ENGRAM_EMBEDDINGS === "openai") return true;
  return Boolean(env.OPENAI_API_KEY || env.OPENAI_BASE_URL);
}

// Measured on paraphrase pairs: the encoder's related pairs sit well above these, unrelated below.
const FLOOR = { offline: 0.3, openai: 0.25 };

/**
 * Embeddings for recall. With a remote route (the tenant's `embedding` route over the server's
 * defaults), the tenant's own metered embedder: every text goes through the tenant's redaction
 * rules, counts against its budget and is recorded as `embed` usage. Otherwise the offline
 * encoder, shared by every tenant and started on first use (nothing leaves the machine).
 */
export function createEmbeddingsProvider(env: Env, models: Pick<ModelProvider, "embeddings">): EmbeddingsProvider {
  let offline: OfflineEmbeddings | undefined;
  return {
    async forTenant(tenantId) {
      const remote = usesOpenAIEmbeddings(env) ? await models.embeddings(tenantId) : null;
      if (remote) return { embeddings: remote, model: remote.model, similarityFloor: FLOOR.openai };
      offline ??= new OfflineEmbeddings();
      return { embeddings: offline, model: OFFLINE_MODEL, similarityFloor: FLOOR.offline };
    },
    async close() {
      await offline?.close();
    },
  };
}
