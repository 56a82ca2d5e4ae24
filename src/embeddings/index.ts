import type { Embeddings } from "@langchain/core/embeddings";
import { OpenAIEmbeddings } from "@langchain/openai";
import type { Env } from "../env.ts";
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
 * Embeddings for recall. The offline encoder is shared by every tenant and started on first use;
 * OpenAI embeddings come from the server-wide route in the environment.
 */
export function createEmbeddingsProvider(
  env: Env,
  options: { create?: (model: string) => Embeddings } = {},
): EmbeddingsProvider {
  let offline: OfflineEmbeddings | undefined;
  let openai: TenantEmbeddings | undefined;
  return {
    async forTenant(_tenantId) {
      // SEAM (model routing and redaction): when per-tenant routing lands, resolve the tenant's
      // `embedding` route here instead of the environment default, and wrap `embeddings` so every
      // text goes through the tenant's redaction function (and is metered) before it is sent.
      if (!usesOpenAIEmbeddings(env)) {
        offline ??= new OfflineEmbeddings();
        return { embeddings: offline, model: OFFLINE_MODEL, similarityFloor: FLOOR.offline };
      }
      openai ??= {
        model: env.ENGRAM_EMBEDDING_MODEL,
        similarityFloor: FLOOR.openai,
        embeddings:
          options.create?.(env.ENGRAM_EMBEDDING_MODEL) ??
          new OpenAIEmbeddings({
            model: env.ENGRAM_EMBEDDING_MODEL,
            apiKey: env.OPENAI_API_KEY ?? "not-needed",
            configuration: env.OPENAI_BASE_URL ? { baseURL: env.OPENAI_BASE_URL } : undefined,
            batchSize: 64,
            maxRetries: env.ENGRAM_MODEL_MAX_RETRIES,
            timeout: env.ENGRAM_MODEL_TIMEOUT_MS,
          }),
      };
      return openai;
    },
    async close() {
      await offline?.close();
    },
  };
}
