import { forTenant } from "../../src/db.ts";
import type { BaseChatModel } from "@langchain/core/language_models/chat_models";
import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import { print } from "graphql";
import { startWorker } from "../../jobs/worker.ts";
import { buildApp, type App } from "../../src/app.ts";
import { readEnv } from "../../src/env.ts";
import { createLogger } from "../../src/log.ts";
import { createTenant } from "../../src/auth.ts";
import { createApiKey } from "../../src/governance/keys.ts";
import type { ModelRoute } from "../../src/models/metered.ts";
import type { Worker } from "../../src/queue.ts";
import { openServices, type Services } from "../../src/services.ts";
import { startModelServer, type ModelServer } from "./model-server.ts";
import { createTestStore, type TestStore } from "./store.ts";

export type TenantKeys = { tenantId: string; admin: string; writer: string; reader: string };

export type GraphQLResult<T> = {
  /** Typed as present: a test that expects an error checks `errors` (data is then null). */
  data: T;
  errors?: { message: string; path?: string[]; extensions?: { code?: string } & Record<string, unknown> }[];
};

export type TestEngram = {
  services: Services;
  app: App;
  store: TestStore;
  /** A tenant with a key of each role. */
  tenant: TenantKeys;
  /** Another tenant, for isolation tests. */
  other: TenantKeys;
  /** In-process GraphQL call through yoga.fetch. */
  gql<T = any, V = Record<string, unknown>>(
    query: string | TypedDocumentNode<T, V>,
    variables?: V,
    key?: string | null,
  ): Promise<GraphQLResult<T>>;
  /** Starts the HTTP + WS server on a free port, for WebSocket tests. */
  listen(): Promise<string>;
  worker?: Worker;
  stop(): Promise<void>;
};

export async function createTenantWithKeys(services: Services, name: string): Promise<TenantKeys> {
  const { tenant, adminKey } = await createTenant(services.db, { name });
  // Made as the CLI makes them (no key did), and audited as such.
  const writer = await createApiKey(forTenant(services.db, tenant.id), { role: "WRITER" }, { apiKeyId: null, via: "cli" });
  const reader = await createApiKey(forTenant(services.db, tenant.id), { role: "READER" }, { apiKeyId: null, via: "cli" });
  return { tenantId: tenant.id, admin: adminKey, writer: writer.key, reader: reader.key };
}

/**
 * A real Engram on a real store (embedded, or PostgreSQL when ENGRAM_TEST_DATABASE_URL is set)
 * with two tenants. Jobs run only when asked, so tests decide when work happens.
 */
export async function startTestEngram(
  options: {
    env?: Record<string, string>;
    createModel?: (route: ModelRoute, chain: string) => BaseChatModel;
    worker?: boolean;
    store?: TestStore;
    /** The key cache's clock: a frozen one keeps every looked-up key cached until it is revoked. */
    clock?: () => number;
    chromaStartRetryMs?: number;
  } = {},
): Promise<TestEngram> {
  const store = options.store ?? (await createTestStore());
  const env = readEnv({
    ENGRAM_LOG_LEVEL: process.env.ENGRAM_TEST_LOG_LEVEL ?? "error",
    ENGRAM_JOB_POLL_MS: "200",
    ...store.vars,
    ...options.env,
  });
  const services = await openServices(env, {
    createModel: options.createModel,
    clock: options.clock,
    chromaStartRetryMs: options.chromaStartRetryMs,
    log: createLogger(env.ENGRAM_LOG_LEVEL),
  });
  const tenant = await createTenantWithKeys(services, "tenant-a");
  const other = await createTenantWithKeys(services, "tenant-b");
  const app = buildApp(services);
  const worker = options.worker ? await startWorker(services) : undefined;
  let listening = false;

  return {
    services,
    app,
    store,
    tenant,
    other,
    worker,
    async gql(query, variables, key = tenant.admin) {
      const response = await app.yoga.fetch("http://engram.test/graphql", {
        method: "POST",
        headers: {
          "content-type": "application/json",
          ...(key ? { authorization: `Bearer ${key}` } : {}),
        },
        body: JSON.stringify({ query: typeof query === "string" ? query : print(query), variables }),
      });
      const result = (await response.json()) as GraphQLResult<any>;
      // A search's usage row is written just after its reply; tests read it as if it were part of it.
      await services.models.settled();
      return result;
    },
    async listen() {
      listening = true;
      return app.start(0, "127.0.0.1");
    },
    async stop() {
      try {
        if (listening) await app.stop();
        else await app.yoga.dispose();
        await worker?.stop();
        await services.close();
      } finally {
        if (!options.store) await store.drop();
      }
    },
  };
}

/** The variables that point Engram's OpenAI clients at a scripted model server, with no retries. */
export function modelEnv(model: ModelServer, apiKey = "test-key"): Record<string, string> {
  return { OPENAI_BASE_URL: model.url, OPENAI_API_KEY: apiKey, ENGRAM_MODEL_MAX_RETRIES: "0" };
}

/**
 * A scripted OpenAI-compatible model server (or the one given) and a test Engram that uses it.
 * `respond` and `embed` are set on the server before Engram starts; `env` adds to modelEnv().
 */
export async function startEngramWithModel(
  options: Parameters<typeof startTestEngram>[0] & {
    model?: ModelServer;
    apiKey?: string;
    respond?: Parameters<ModelServer["respond"]>[0];
    embed?: Parameters<ModelServer["embed"]>[0];
  } = {},
): Promise<{ model: ModelServer; engram: TestEngram }> {
  const { model: given, apiKey, respond, embed, env, ...rest } = options;
  const model = given ?? (await startModelServer());
  if (respond) model.respond(respond);
  if (embed) model.embed(embed);
  try {
    const engram = await startTestEngram({ ...rest, env: { ...modelEnv(model, apiKey), ...env } });
    return { model, engram };
  } catch (error) {
    if (!given) await model.stop();
    throw error;
  }
}
