import { Embeddings } from "@langchain/core/embeddings";
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

// Query vectors kept per process (a message is often embedded again: context then recall, a retry,
// an eval replaying its questions); about 2 KB each at 512 dimensions.
const QUERY_CACHE_SIZE = 2_000;

/** An embedder whose embedQuery answers a text it has embedded before from memory (least recently used go first). */
class CachedQueries extends Embeddings {
  constructor(
    private readonly inner: Embeddings,
    private readonly cache: Map<string, Promise<number[]>>,
    private readonly prefix: string,
  ) {
    super({});
  }

  embedDocuments(documents: string[]): Promise<number[][]> {
    return this.inner.embedDocuments(documents);
  }

  embedQuery(document: string): Promise<number[]> {
    const key = `${this.prefix}\u0000${document}`;
    const hit = this.cache.get(key);
    if (hit) {
      this.cache.delete(key);
      this.cache.set(key, hit);
      return hit;
    }
    const vector = this.inner.embedQuery(document);
    this.cache.set(key, vector);
    // A failure is not kept: the next call asks again.
    vector.catch(() => this.cache.get(key) === vector && this.cache.delete(key));
    if (this.cache.size > QUERY_CACHE_SIZE) this.cache.delete(this.cache.keys().next().value!);
    return vector;
  }
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
  const queries = new Map<string, Promise<number[]>>();
  return {
    async forTenant(tenantId) {
      const remote = usesOpenAIEmbeddings(env) ? await models.embeddings(tenantId) : null;
      // A remote route's vectors are not kept: its redaction rules, budget and base URL may change between calls.
      if (remote) return { embeddings: remote, model: remote.model, similarityFloor: FLOOR.openai };
      offline ??= new OfflineEmbeddings();
      return { embeddings: new CachedQueries(offline, queries, OFFLINE_MODEL), model: OFFLINE_MODEL, similarityFloor: FLOOR.offline };
    },
    async close() {
      await offline?.close();
    },
  };
}
