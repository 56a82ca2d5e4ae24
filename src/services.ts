import type { BaseChatModel } from "@langchain/core/language_models/chat_models";
import { createDb, forTenant, type Db, type TenantDirectory } from "./db.ts";
import type { Deps } from "./deps.ts";
import { createAgendaQueue, type AgendaQueue } from "./agenda-queue.ts";
import type { Env } from "./env.ts";
import { createLogger, type Logger } from "./log.ts";
import type { ModelRoute } from "./models/metered.ts";
import { createModelProvider, type ModelProvider } from "./models/provider.ts";
import { recordingActivity } from "./memory/activity.ts";
import { createEngramPubSub, type PubSub } from "./pubsub.ts";
import { createEmbeddingsProvider, type EmbeddingsProvider } from "./embeddings/index.ts";
import { lazyChroma, type LazyChroma } from "./embedded/chroma.ts";
import { withVectorCache, type CachedVectorStore } from "./vectors/cache.ts";
import { createChromaVectorStore } from "./vectors/chroma.ts";
import type { VectorStore } from "./vectors/index.ts";
import {
  attachOrStartEmbeddedStore,
  externalStore,
  startEmbeddedStore,
  type Store,
} from "./embedded/embedded.ts";
import { migrate } from "./embedded/migrate.ts";
import { createKeyCache, type KeyCache } from "./auth.ts";
import { withTimeout } from "./timeout.ts";
import { STOPPED_RUN } from "./work/job-runs.ts";

/**
 * The composition root of a process (the API, the worker, the CLI): the store, the one raw
 * database client, and the `deps` that domain and work functions are handed. Only app, main,
 * cli, the worker and tests hold a Services; everything else gets a TenantDb and part of `deps`.
 */
export type Services = Deps & {
  keys: KeyCache;
  store: Store;
  db: Db;
  /** Everything but the raw client and the store: what the GraphQL context and jobs hand on. */
  deps: Deps;
  queue: AgendaQueue;
  /** The Chroma behind the vectors: external (CHROMA_URL) or embedded, started on first use (the server's at start-up). */
  chroma: LazyChroma;
  /** The in-process copies of recently searched users' vectors (vectors/cache.ts); null when ENGRAM_VECTOR_CACHE_MB is 0. */
  vectorCache: CachedVectorStore | null;
  close(options?: { stepMs?: number }): Promise<void>;
};

/** The tenant directory over the raw client: the only way work code reaches several tenants. */
export function tenantDirectory(db: Db): TenantDirectory {
  return {
    scoped: (tenantId) => forTenant(db, tenantId),
    active: (tenantId) =>
      db.tenant.findMany({
        where: { active: true, ...(tenantId ? { id: tenantId } : {}) },
        select: { id: true, name: true, createdAt: true },
        orderBy: { createdAt: "asc" },
      }),
  };
}

export type OpenOptions = {
  /** CLI commands go through a running server's embedded store instead of refusing. */
  attach?: boolean;
  /** Tests hand in a scripted model; production builds ChatOpenAI from the routes. */
  createModel?: (route: ModelRoute, chain: string) => BaseChatModel;
  log?: Logger;
  /** The key cache's clock (ms, monotonic); tests freeze it so cached lookups are deterministic. */
  clock?: () => number;
  /** How long after a failed start of the embedded Chroma a health check tries it again (default 30 s). */
  chromaStartRetryMs?: number;
};


async function releaseClaimsOfTheDead(db: Db, log: Logger) {
  const [{ queue }] = await db.$queryRaw<{ queue: boolean }[]>`SELECT to_regclass('agenda_jobs') IS NOT NULL AS queue`;
  // A one-off job Agenda was running has no next run (it is set again only when the run ends), so
  // a lock taken off alone would leave the row looking finished, never run again, and pruned at
  // night: it is due now, as it is on PostgreSQL once its lock lapses.
  const jobs = queue
    ? await db.$executeRaw`UPDATE "agenda_jobs" SET "locked_at" = NULL, "next_run_at" = COALESCE("next_run_at", now()) WHERE "locked_at" IS NOT NULL`
    : 0;
  const leases = await db.$executeRaw`
    UPDATE "Conversation" SET "summaryLeaseUntil" = NULL, "extractionLeaseUntil" = NULL, "gateLeaseUntil" = NULL
    WHERE "summaryLeaseUntil" IS NOT NULL OR "extractionLeaseUntil" IS NOT NULL OR "gateLeaseUntil" IS NOT NULL`;
  // The runs it was recording (jobRuns, the inspector) would otherwise say RUNNING for ever.
  const runs = await db.$executeRaw`
    UPDATE "JobRun" SET "status" = 'FAILED', "error" = ${STOPPED_RUN}, "finishedAt" = now() WHERE "status" = 'RUNNING'`;
  if (jobs || leases || runs) log.info("released the claims of a process that stopped without cleaning up", { jobs, leases, runs });
}

/**
 * Opens the store (PostgreSQL at DATABASE_URL, else embedded PGlite in ENGRAM_DATA_DIR),
 * applies pending migrations, and builds what runs on top of it.
 */
export async function openServices(env: Env, options: OpenOptions = {}): Promise<Services> {
  const log = options.log ?? createLogger(env.ENGRAM_LOG_LEVEL);
  const store = env.DATABASE_URL
    ? externalStore(env.DATABASE_URL)
    : options.attach
      ? await attachOrStartEmbeddedStore(env.ENGRAM_DATA_DIR, { log })
      : await startEmbeddedStore(env.ENGRAM_DATA_DIR, { log });
  try {
    const applied = await migrate(store.url);
    if (applied.length) log.info("applied migrations", { applied });
  } catch (error) {
    await store.stop();
    throw error;
  }
  const db = createDb(store.url, (error) => log.warn("database connection lost", { error }));
  // The embedded store has one owner process: whatever was claimed before this one opened it
  // (job locks, conversation leases) belonged to a process that died, and is free now.
  if (store.kind === "embedded" && !options.attach) await releaseClaimsOfTheDead(db, log);
  const tenants = tenantDirectory(db);
  const pubsub = recordingActivity(createEngramPubSub(env.REDIS_URL, log), tenants, log);
  const models = createModelProvider({ tenants, env, createModel: options.createModel, log });
  const queue = createAgendaQueue(store, { pollMs: env.ENGRAM_JOB_POLL_MS, lockMs: env.ENGRAM_JOB_LOCK_MS }, log);
  const chroma = lazyChroma({
    url: env.CHROMA_URL,
    dataDir: env.ENGRAM_DATA_DIR,
    host: store.hostChroma,
    onStart: (url) => log.debug("embedded Chroma started", { url }),
    onHostGivenUp: (error) => log.warn("the embedded Chroma failed in the database's process; it runs in a process of its own from now on", { error }),
    onStartFailed: (error) =>
      log.error("the embedded Chroma failed to start; recall answers from keywords, and it is tried again on next use and by the health check", { error }),
    startRetryMs: options.chromaStartRetryMs,
  });
  const chromaVectors = createChromaVectorStore(chroma.get, log, { searchTimeoutMs: env.ENGRAM_VECTOR_SEARCH_TIMEOUT_MS });
  const vectorCache =
    env.ENGRAM_VECTOR_CACHE_MB > 0
      ? withVectorCache(chromaVectors, { maxBytes: env.ENGRAM_VECTOR_CACHE_MB * 2 ** 20, ttlMs: env.ENGRAM_VECTOR_CACHE_TTL_MS, pubsub, log })
      : null;
  const vectors = vectorCache ?? chromaVectors;
  const embeddings = createEmbeddingsProvider(env, models);
  const keys = createKeyCache(db, pubsub, { ttlMs: env.ENGRAM_KEY_CACHE_TTL_MS, now: options.clock });
  const deps: Deps = { env, log, pubsub, models, queue, embeddings, vectors, tenants, keys };
  return {
    ...deps,
    keys,
    deps,
    vectorCache,
    store,
    db,
    queue,
    chroma,
    /** `stepMs`: how long each closing step may take before it is named and left (default 5 s). */
    async close({ stepMs = CLOSE_STEP_MS }: { stepMs?: number } = {}) {
      // In stages, each waiting at most CLOSE_STEP_MS and run even if one before it failed: the
      // queue, then at once the parts that may still write through the database client (the
      // pubsub's history rows, the usage rows of searches) or hold a child (a Chroma on the store's
      // thread ends with the store), then that client, then the store, bounded by its
      // own stop (cutting that short could cut a checkpoint).
      let failure: unknown;
      const run = async (done: string, step: () => Promise<unknown>, bounded = true) => {
        try {
          await (bounded ? withTimeout(step(), stepMs, `not ${done} within ${stepMs / 1000} s`) : step());
          log.debug(done);
        } catch (error) {
          log.warn(`while closing: ${done.split(" ")[0]} failed`, { error });
          failure ??= error;
        }
      };
      await run("job queue closed", () => queue.close());
      await Promise.all([
        run("recall embeddings closed", () => embeddings.close()),
        run("vectors closed", () => vectors.close()),
        run("Chroma stopped", () => chroma.stop()),
        run("key cache closed", () => keys.close()),
        run("pubsub closed", () => pubsub.close()),
        run("usage rows stored", () => models.settled()),
      ]);
      await run("database client closed", () => db.$disconnect());
      await run("store stopped", () => store.stop(), false);
      if (failure) throw failure;
    },
  };
}

/**
 * How long one stage of close() may take. A pool whose connection the server cut mid-query can
 * wait forever for it to be released; past this the step is abandoned and the next stage runs.
 */
const CLOSE_STEP_MS = 5_000;

