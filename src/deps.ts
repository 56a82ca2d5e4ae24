import type { TenantDb } from "./db.ts";
import type { EmbeddingsProvider } from "./embeddings/index.ts";
import type { Env } from "./env.ts";
import type { Logger } from "./log.ts";
import type { ModelProvider } from "./models/provider.ts";
import type { PubSub } from "./pubsub.ts";
import type { JobQueue } from "./queue.ts";
import type { VectorStore } from "./vectors/index.ts";

/** The tenants a cross-tenant sweep (compaction, retention, reconcile) walks, each behind its own scoped client. */
export type TenantDirectory = {
  /** The one tenant-scoped client for a tenant id. */
  scoped(tenantId: string): TenantDb;
  /** Active tenants, or just the one named; with their settings row. */
  active(tenantId?: string): Promise<{ id: string; name: string; createdAt: Date }[]>;
};

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
};
