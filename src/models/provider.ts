import { AsyncLocalStorage } from "node:async_hooks";
import { Embeddings } from "@langchain/core/embeddings";
import type { BaseChatModel } from "@langchain/core/language_models/chat_models";
import { OpenAIClient, OpenAIEmbeddings, getHeadersWithUserAgent, wrapOpenAIClientError } from "@langchain/openai";
import type { TenantDirectory } from "../db.ts";
import type { Env } from "../env.ts";
import type { Logger } from "../log.ts";
import { budgetSpent, budgetStatus, releaseBudget, reserveBudget, type BudgetStatus } from "../governance/budget.ts";
import { redactTexts, type RedactionResult } from "../governance/redaction.ts";
import { loadTenantSettings, tenantApiKey, type EffectiveSettings } from "../governance/settings.ts";
import { countTokens } from "../memory/tokens.ts";
import {
  asModelCallError,
  billedUnanswered,
  egressPolicy,
  guardedFetch,
  MODEL_ANSWER_MAX_BYTES,
  modelCallDeadlineMs,
  noteExchanges,
  replySignal,
  withinDeadline,
  type Exchanges,
} from "./egress.ts";
import { recordModelUsage, recordModelUsages } from "../governance/usage.ts";
import {
  defaultModelName,
  defaultRoute,
  meteredModel,
  openAIChatModel,
  recordUnanswered,
  reportedTokens,
  type ChatModel,
  type ChatRole,
  type MeteringHooks,
  type ModelRole,
  type ModelRoute,
  type ModelUsageRecord,
} from "./metered.ts";

/**
 * Hands chains their model for a tenant and role, per the tenant's routing over the server's
 * defaults; every call is budgeted, redacted and metered for that tenant. Null when no model is
 * configured for the role.
 */
export type ModelProvider = {
  /** Chains get theirs through chainFor (chains/registry.ts), which names the chain. */
  chat(tenantId: string, role: ChatRole, chain: string): Promise<ChatModel | null>;
  /** The route a role resolves to now (tenant settings over env defaults), key included. */
  route(tenantId: string, role: ModelRole): Promise<ModelRoute | null>;
  /** The embedding route: null means no remote embedding model (use the offline encoder). */
  embeddingRoute(tenantId: string): Promise<ModelRoute | null>;
  /**
   * Remote embeddings on the tenant's embedding route, with inputs redacted, held against the
   * budget as chat calls are (refused with BUDGET_EXHAUSTED) and recorded under chain "embed";
   * null when there is no route.
   */
  embeddings(tenantId: string): Promise<TenantEmbeddings | null>;
  /** The tenant's redaction rules applied to texts bound for any model (stored data unchanged). */
  redactForTenant(tenantId: string, texts: string[]): Promise<RedactionResult>;
  /** Records a model call made outside `chat` (e.g. embeddings) under memory:<model>. */
  recordUsage(tenantId: string, usage: ModelUsageRecord): Promise<void>;
  /** Where the tenant stands against its monthly token limit (its own budget, or the server's lower ceiling). */
  budget(tenantId: string): Promise<BudgetStatus>;
  /** Whether the tenant has spent that limit this month, without a statement when there is none. */
  budgetSpent(tenantId: string): Promise<boolean>;
  /** Resolves once the usage rows written after a search's reply are stored (shutdown, tests). */
  settled(): Promise<void>;
};

/**
 * A role's route: the tenant's fields over the server's. The server's own API key is only ever
 * sent to the server's own endpoint, never to a base URL a tenant configured.
 */
export function resolveRoute(env: Env, settings: EffectiveSettings, tenantId: string, role: ModelRole): ModelRoute | null {
  const own = settings.modelRouting[role];
  const fallback = defaultRoute(env, role);
  if (!own) return fallback;
  const ownKey = tenantApiKey(settings, tenantId, role, env.ENGRAM_SECRET);
  if (!own.baseUrl && !ownKey && !fallback) return null;
  const baseUrl = own.baseUrl ?? fallback?.baseUrl ?? env.OPENAI_BASE_URL;
  const serverEndpoint = !own.baseUrl || own.baseUrl === env.OPENAI_BASE_URL;
  return {
    baseUrl,
    model: own.model ?? defaultModelName(env, role),
    apiKey: ownKey ?? (serverEndpoint ? env.OPENAI_API_KEY : undefined),
  };
}

/** What the embedding API said it read, for the one call that asked (one embedder serves concurrent calls). */
type EmbedUsage = { responses: number; reported: number; promptTokens: number };
/** One embedding call: the signal that tears its requests down at its deadline, and its usage. */
const embedCall = new AsyncLocalStorage<{ signal: AbortSignal; usage: EmbedUsage }>();

/**
 * OpenAI embeddings whose requests carry their call's signal, and that hand each response's
 * `usage.prompt_tokens` to the call that asked. The meter takes the provider's count: it is the
 * one the provider bills (embedding models tokenize with their own encoding), and it spares every
 * embedding call a tokenizer run, and the process the ~65 MB the tokenizer takes once loaded.
 */
class ReportingOpenAIEmbeddings extends OpenAIEmbeddings {
  protected override async embeddingWithRetry(request: Parameters<OpenAIEmbeddings["embeddingWithRetry"]>[0]) {
    // Read before any await, in the asking call's own context: inside LangChain's AsyncCaller (a
    // p-queue) the store can be another caller's.
    const call = embedCall.getStore();
    // The base class's client and retries, but it sends every request without a signal, so a
    // stalled one would outlive its call's deadline and keep its place in the caller's queue.
    this.client ??= new OpenAIClient({
      ...this.clientConfig,
      timeout: this.timeout,
      maxRetries: 0,
      defaultHeaders: getHeadersWithUserAgent(this.clientConfig.defaultHeaders),
    });
    const response = await this.caller.callWithOptions({ signal: call?.signal }, async () => {
      try {
        return await this.client.embeddings.create(request, { signal: call?.signal });
      } catch (error) {
        throw wrapOpenAIClientError(error);
      }
    });
    if (call) {
      call.usage.responses += 1;
      const tokens = reportedTokens(response.usage?.prompt_tokens);
      // Some compatible servers answer 0 for "not counted": that would meter embeddings as free.
      if (tokens !== undefined && tokens > 0) {
        call.usage.reported += 1;
        call.usage.promptTokens += tokens;
      }
    }
    return response;
  }
}

/**
 * What an embedding call holds against the budget: a third of its texts' UTF-8 bytes, an upper
 * estimate of o200k-style counts for prose (about 4 characters a token), code (about 3) and CJK
 * (3 bytes a character, about a token each), with no tokenizer run (~65 MB once loaded). Text of
 * one-letter words or digits separated by spaces can count more; the meter records the
 * provider's own count either way.
 */
export const embeddingTokensHeld = (texts: string[]) => texts.reduce((sum, text) => sum + Math.ceil(Buffer.byteLength(text) / 3), 0);

/** Holds a call's expected tokens against the tenant's budget, or throws BUDGET_EXHAUSTED (MeteringHooks.reserve). */
type Reserve = NonNullable<MeteringHooks["reserve"]>;

/**
 * Embeddings that hold their expected tokens against the budget, redact what they send and record
 * what they used. A query's usage row is written after its vector is handed back (`recordAfter`,
 * which gives the hold back once the row is stored): a search waits on its vector, not on its
 * meter. Documents (indexing, in the worker) are recorded, and their hold given back, before they
 * return.
 */
export class TenantEmbeddings extends Embeddings {
  constructor(
    private readonly inner: Embeddings,
    readonly model: string,
    private readonly hooks: {
      reserve: Reserve;
      redact: (texts: string[]) => Promise<RedactionResult>;
      record: (usage: ModelUsageRecord) => Promise<void>;
      recordAfter: (usage: ModelUsageRecord, release?: () => Promise<void>) => void;
      /** How long one call may take in all, retries included (modelCallDeadlineMs). */
      deadlineMs: number;
    },
  ) {
    super({});
  }

  private async embed(documents: string[]): Promise<{ vectors: number[][]; usage: ModelUsageRecord }> {
    const { texts, redactions } = await this.hooks.redact(documents);
    const usageOf = (inputTokens: number): ModelUsageRecord => ({ chain: "embed", model: this.model, inputTokens, outputTokens: 0, redactions });
    const counted = () => texts.reduce((sum, text) => sum + countTokens(text), 0);
    const noted: Exchanges = { sent: 0, refused: 0 };
    try {
      const usage: EmbedUsage = { responses: 0, reported: 0, promptTokens: 0 };
      const vectors = await noteExchanges(noted, () =>
        withinDeadline(
          this.hooks.deadlineMs,
          (signal) => embedCall.run({ signal, usage }, () => this.inner.embedDocuments(texts)),
          replySignal.getStore(),
        ),
      );
      // A server that reports no usage (some OpenAI-compatible ones), or 0, is metered by our own count.
      const reported = usage.responses > 0 && usage.reported === usage.responses;
      return { vectors, usage: usageOf(reported ? usage.promptTokens : counted()) };
    } catch (error) {
      // Sent and never answered whole: the provider may bill the texts (as a chat call's prompt).
      if (billedUnanswered(noted)) await recordUnanswered(this.hooks.record, usageOf(counted()));
      throw asModelCallError(error);
    }
  }

  // Held on the texts before redaction, so a refused call costs no redaction run (as chat calls).
  async embedDocuments(documents: string[]): Promise<number[][]> {
    const release = await this.hooks.reserve({ inputTokens: () => embeddingTokensHeld(documents) });
    try {
      const { vectors, usage } = await this.embed(documents);
      await this.hooks.record(usage);
      return vectors;
    } finally {
      await release?.();
    }
  }

  async embedQuery(document: string): Promise<number[]> {
    const release = await this.hooks.reserve({ inputTokens: () => embeddingTokensHeld([document]) });
    let recorded = false;
    try {
      const { vectors, usage } = await this.embed([document]);
      this.hooks.recordAfter(usage, release);
      recorded = true;
      return vectors[0];
    } finally {
      if (!recorded) await release?.();
    }
  }
}

/**
 * The output tokens a chat call holds against the budget besides its prompt: no chain sets a
 * max_tokens (a cut answer is an unreadable one), and the longest answer one asks for is a summary
 * of up to 1,000 words in its JSON, about 1,400 tokens.
 */
const OUTPUT_TOKENS_HELD = 2_000;

/** How long a search's query-embedding usage row waits to be stored with the others of that moment. */
const USAGE_AFTER_MS = 250;

export function createModelProvider(deps: {
  tenants: Pick<TenantDirectory, "scoped">;
  env: Env;
  /** Tests pass a scripted model here; production builds ChatOpenAI from the route. */
  createModel?: (route: ModelRoute, chain: string) => BaseChatModel;
  log: Pick<Logger, "warn">;
}): ModelProvider {
  const { tenants, env } = deps;
  // Every OpenAI client, chat and embeddings, connects through these.
  const guarded = (maxBodyBytes: number) =>
    guardedFetch(egressPolicy(env), { idleTimeoutMs: env.ENGRAM_MODEL_TIMEOUT_MS, maxBodyBytes }, (host, why) =>
      deps.log.warn("model call refused: its host's name did not resolve to public addresses", { host, why }),
    );
  const fetch = guarded(MODEL_ANSWER_MAX_BYTES.chat);
  const embeddingsFetch = guarded(MODEL_ANSWER_MAX_BYTES.embeddings);
  const deadlineMs = modelCallDeadlineMs(env);
  const createModel =
    deps.createModel ??
    ((route: ModelRoute, chain: string) =>
      openAIChatModel(route, {
        timeoutMs: env.ENGRAM_MODEL_TIMEOUT_MS,
        maxRetries: env.ENGRAM_MODEL_MAX_RETRIES,
        chain,
        fetch,
      }));
  const redactWith = (settings: EffectiveSettings, tenant: string) => (texts: string[]) =>
    redactTexts(settings.redaction, texts, { tenant });
  const recordFor = (tenantId: string) => (usage: ModelUsageRecord) => recordModelUsage(tenants.scoped(tenantId), usage);
  // Usage rows written after the reply they belong to (a search's query embedding): gathered for
  // USAGE_AFTER_MS and stored per tenant together (insertRows), since on the embedded store every
  // statement waits its turn with the next request's.
  // Their budget holds are given back once the rows are stored, as a chat call's are after its row.
  const pendingUsage = new Set<Promise<void>>();
  const afterRows = new Map<string, { rows: ModelUsageRecord[]; releases: (() => Promise<void>)[] }>();
  let afterTimer: NodeJS.Timeout | undefined;
  const storeAfterRows = () => {
    clearTimeout(afterTimer);
    afterTimer = undefined;
    for (const [tenantId, { rows, releases }] of afterRows) {
      const write = recordModelUsages(tenants.scoped(tenantId), rows)
        .catch((error) => deps.log.warn("could not record query embeddings' usage", { tenantId, rows: rows.length, error }))
        .then(() => Promise.all(releases.map((release) => release())))
        .then(() => undefined);
      pendingUsage.add(write);
      void write.finally(() => pendingUsage.delete(write));
    }
    afterRows.clear();
  };
  const recordAfterFor = (tenantId: string) => (usage: ModelUsageRecord, release?: () => Promise<void>) => {
    const after = afterRows.get(tenantId) ?? afterRows.set(tenantId, { rows: [], releases: [] }).get(tenantId)!;
    after.rows.push(usage);
    if (release) after.releases.push(release);
    afterTimer ??= setTimeout(storeAfterRows, USAGE_AFTER_MS);
  };
  // One OpenAI client per route (its connection pool is reused across requests), not one per search.
  const embedders = new Map<string, ReportingOpenAIEmbeddings>();
  const embedderFor = (route: ModelRoute) => {
    const key = JSON.stringify([route.baseUrl, route.model, route.apiKey]);
    let embedder = embedders.get(key);
    if (!embedder) {
      embedder = new ReportingOpenAIEmbeddings({
        model: route.model,
        apiKey: route.apiKey ?? "not-needed",
        configuration: { baseURL: route.baseUrl, fetch: embeddingsFetch },
        // The openai client asks for base64 by default; OpenAI-compatible servers that ignore the
        // field answer floats, which it then decodes to empty vectors. Floats work everywhere.
        encodingFormat: "float",
        timeout: env.ENGRAM_MODEL_TIMEOUT_MS,
        maxRetries: env.ENGRAM_MODEL_MAX_RETRIES,
      });
      embedders.set(key, embedder);
      // Routes change rarely; a tenant cycling keys must not grow this without bound.
      if (embedders.size > 1_000) embedders.delete(embedders.keys().next().value!);
    }
    return embedder;
  };

  // The operator's ceiling on any tenant's month, whatever budget the tenant sets itself.
  const ceiling = env.ENGRAM_MONTHLY_TOKEN_BUDGET ?? null;
  // A hold outlives the longest a call can take: every try timing out, and LangChain's backoff
  // between tries (at most 2 s, doubling each time). Only a call whose process died outlives its
  // hold, so a crash never keeps a tenant's budget held for longer than this.
  const retries = env.ENGRAM_MODEL_MAX_RETRIES;
  const holdMs = env.ENGRAM_MODEL_TIMEOUT_MS * (retries + 1) + 2_000 * (2 ** retries - 1) + 60_000;
  // `outputTokens`: what the call holds besides its input (OUTPUT_TOKENS_HELD for chat, 0 for embeddings).
  const reserveFor = (tenantId: string, outputTokens: number): Reserve => async (prompt) => {
    const tenantDb = tenants.scoped(tenantId);
    const held = await reserveBudget(tenantDb, ceiling, () => prompt.inputTokens() + outputTokens, holdMs);
    if (!held) return undefined;
    return () =>
      releaseBudget(tenantDb, held).catch((error) =>
        deps.log.warn("could not release a model call's budget hold; it lapses by itself", { tenantId, error }),
      );
  };

  return {
    async chat(tenantId, role, chain) {
      const tenantDb = tenants.scoped(tenantId);
      const settings = await loadTenantSettings(tenantDb);
      const route = resolveRoute(env, settings, tenantId, role);
      if (!route) return null;
      return meteredModel(createModel(route, chain), { chain, model: route.model }, {
        deadlineMs,
        // Held per call, not per job: a budget spent mid-job stops the rest of it.
        reserve: reserveFor(tenantId, OUTPUT_TOKENS_HELD),
        // Likewise the redaction rules: a rule added mid-job applies to the job's next call.
        redact: async (texts) => redactWith(await loadTenantSettings(tenantDb), tenantId)(texts),
        record: recordFor(tenantId),
      });
    },
    async route(tenantId, role) {
      return resolveRoute(env, await loadTenantSettings(tenants.scoped(tenantId)), tenantId, role);
    },
    async embeddingRoute(tenantId) {
      return this.route(tenantId, "embedding");
    },
    async embeddings(tenantId) {
      const settings = await loadTenantSettings(tenants.scoped(tenantId));
      const route = resolveRoute(env, settings, tenantId, "embedding");
      if (!route) return null;
      return new TenantEmbeddings(embedderFor(route), route.model, {
        reserve: reserveFor(tenantId, 0),
        redact: redactWith(settings, tenantId),
        record: recordFor(tenantId),
        recordAfter: recordAfterFor(tenantId),
        deadlineMs,
      });
    },
    async redactForTenant(tenantId, texts) {
      return redactWith(await loadTenantSettings(tenants.scoped(tenantId)), tenantId)(texts);
    },
    recordUsage: (tenantId, usage) => recordFor(tenantId)(usage),
    budget: (tenantId) => budgetStatus(tenants.scoped(tenantId), ceiling),
    budgetSpent: (tenantId) => budgetSpent(tenants.scoped(tenantId), ceiling),
    async settled() {
      // Rows gathered or writes started while waiting (a job finishing during shutdown) are waited for too.
      do {
        storeAfterRows();
        await Promise.all([...pendingUsage]);
      } while (pendingUsage.size || afterRows.size);
    },
  };
}
