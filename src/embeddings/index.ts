import { createHash } from "node:crypto";
import { Embeddings } from "@langchain/core/embeddings";
import type { Env } from "../env.ts";
import { usesOpenAIEmbeddings } from "../governance/settings.ts";
import type { ModelProvider } from "../models/provider.ts";
import { OFFLINE_MODEL, OfflineEmbeddings } from "./offline.ts";

/** A tenant's embedder, with the model name its vectors are filed under. */
export type TenantEmbeddings = {
  embeddings: Embeddings;
  /** Recorded on each snippet and part of the Chroma collection name. */
  model: string;
  /** Cosine similarity below which a snippet is not recalled without the judge. */
  similarityFloor: number;
  /** The offline encoder, shared by every tenant (a remote route is the tenant's, whatever its model's name). */
  offline: boolean;
};

export type EmbeddingsProvider = {
  forTenant(tenantId: string): Promise<TenantEmbeddings>;
  /** Drops this instance's kept query vectors of the tenant (a forget ran: one may be of what it removed). */
  forgetQueries(tenantId: string): void;
  close(): Promise<void>;
};

// Query vectors kept per process (a message is often embedded again: context then recall, a retry,
// an eval replaying its questions); about 2 KB each at 512 dimensions.
const QUERY_CACHE_SIZE = 2_000;
// How long a kept vector is used. A forget drops its tenant's vectors on the instance that runs
// it; this bounds how long another instance keeps the vector of a message that was forgotten.
const QUERY_CACHE_MAX_AGE_MS = 10 * 60_000;

type Kept = { tenantId: string; vector: Promise<number[]>; at: number };

/**
 * The query vectors, least recently used first. Keyed by tenant and a hash of the text: no text is
 * held in memory, and no tenant can tell from how fast it is answered what another embedded.
 */
class QueryCache {
  private readonly kept = new Map<string, Kept>();

  constructor(private readonly now: () => number = Date.now) {}

  embed(tenantId: string, model: string, text: string, embed: (text: string) => Promise<number[]>): Promise<number[]> {
    const key = `${tenantId}\u0000${model}\u0000${createHash("sha256").update(text).digest("base64")}`;
    const hit = this.kept.get(key);
    this.kept.delete(key);
    if (hit && this.now() - hit.at < QUERY_CACHE_MAX_AGE_MS) {
      this.kept.set(key, hit);
      return hit.vector;
    }
    const vector = embed(text);
    const kept = { tenantId, vector, at: this.now() };
    this.kept.set(key, kept);
    // A failure is not kept: the next call asks again.
    vector.catch(() => this.kept.get(key) === kept && this.kept.delete(key));
    if (this.kept.size > QUERY_CACHE_SIZE) this.kept.delete(this.kept.keys().next().value!);
    return vector;
  }

  forgetTenant(tenantId: string): void {
    for (const [key, kept] of this.kept) if (kept.tenantId === tenantId) this.kept.delete(key);
  }
}

/** An embedder whose embedQuery answers a text the tenant had embedded before from memory. */
class CachedQueries extends Embeddings {
  constructor(
    private readonly inner: Embeddings,
    private readonly cache: QueryCache,
    private readonly tenantId: string,
    private readonly model: string,
  ) {
    super({});
  }

  embedDocuments(documents: string[]): Promise<number[][]> {
    return this.inner.embedDocuments(documents);
  }

  embedQuery(document: string): Promise<number[]> {
    return this.cache.embed(this.tenantId, this.model, document, (text) => this.inner.embedQuery(text));
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
export function createEmbeddingsProvider(
  env: Env,
  models: Pick<ModelProvider, "embeddings">,
  now: () => number = Date.now,
): EmbeddingsProvider {
  let offline: OfflineEmbeddings | undefined;
  const queries = new QueryCache(now);
  return {
    async forTenant(tenantId) {
      const remote = usesOpenAIEmbeddings(env) ? await models.embeddings(tenantId) : null;
      // A remote route's vectors are not kept: its redaction rules, budget and base URL may change between calls.
      if (remote) return { embeddings: remote, model: remote.model, similarityFloor: FLOOR.openai, offline: false };
      offline ??= new OfflineEmbeddings();
      return { embeddings: new CachedQueries(offline, queries, tenantId, OFFLINE_MODEL), model: OFFLINE_MODEL, similarityFloor: FLOOR.offline, offline: true };
    },
    forgetQueries(tenantId) {
      queries.forgetTenant(tenantId);
    },
    async close() {
      await offline?.close();
    },
  };
}
