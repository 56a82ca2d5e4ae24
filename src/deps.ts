import type { TenantDirectory } from "./db.ts";
import type { EmbeddingsProvider } from "./embeddings/index.ts";
import type { Env } from "./env.ts";
import type { Logger } from "./log.ts";
import type { ModelProvider } from "./models/provider.ts";
import type { PubSub } from "./pubsub.ts";
import type { JobQueue } from "./queue.ts";
import type { VectorStore } from "./vectors/index.ts";

/**
 * What domain and work functions may be handed, beside a tenant-scoped client: never the raw
 * database client. Each function takes only the part it uses: `(db, deps: Pick<Deps, …>, input)`.
 */
export type Deps = {
  env: Env;
  log: Logger;
  pubsub: PubSub;
  models: ModelProvider;
  queue: JobQueue;
  embeddings: EmbeddingsProvider;
  vectors: VectorStore;
  tenants: TenantDirectory;
  /** This instance's API-key cache: a revocation drops the key from it at once. */
  keys: { revoked(apiKeyId: string): void };
};
