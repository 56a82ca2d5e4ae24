import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import { print } from "graphql";

/**
 * Why a call failed. GraphQL errors keep the server's `extensions.code` (BAD_USER_INPUT,
 * NOT_FOUND, FORBIDDEN, CONFLICT, UNAUTHENTICATED…); the client adds NETWORK_ERROR, HTTP_ERROR,
 * TIMEOUT and ABORTED for failures that never got a GraphQL answer.
 */
export class EngramError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly details: {
      /** HTTP status, when a response came back. */
      status?: number;
      /** The server's GraphQL errors, all of them (the first gives code and message). */
      errors?: readonly GraphQLErrorShape[];
      /** How many attempts were made. */
      attempts?: number;
      cause?: unknown;
    } = {},
  ) {
    super(message, { cause: details.cause });
    this.name = "EngramError";
  }

  /** The failures a retry may cure: the network, a timeout, a 5xx. */
  get retryable(): boolean {
    return this.code === "NETWORK_ERROR" || this.code === "TIMEOUT" || (this.details.status ?? 0) >= 500;
  }
}

export type GraphQLErrorShape = {
  message: string;
  path?: readonly (string | number)[];
  extensions?: { code?: string } & Record<string, unknown>;
};

export type CallOptions = {
  /** Ends the call (and its retries) with an ABORTED error. */
  signal?: AbortSignal;
  /** Per attempt; default the client's timeoutMs. */
  timeoutMs?: number;
};

export const DEFAULT_TIMEOUT_MS = 30_000;

export type TransportOptions = {
  /** Engram's base URL, e.g. http://127.0.0.1:4000 (the GraphQL path is added). */
  url: string;
  apiKey: string;
  /**
   * Per attempt, default 30 s: above the server's deadline for a request's model calls
   * (ENGRAM_REPLY_MODEL_TIMEOUT_MS, 10 s by default), so a stalled model provider gives the
   * degraded answer the server makes, not a timeout and a retry that calls the model again.
   */
  timeoutMs?: number;
  /** Attempts after the first for retryable failures of idempotent calls, default 3. */
  retries?: number;
  /** First backoff; doubled each retry, with jitter. Default 200 ms. */
  backoffMs?: number;
  fetch?: typeof fetch;
};

const printed = new WeakMap<object, string>();
function queryText(document: TypedDocumentNode<any, any>): string {
  let text = printed.get(document);
  if (!text) printed.set(document, (text = print(document)));
  return text;
}

const abortedError = (signal: AbortSignal) =>
  new EngramError("ABORTED", "The call was aborted.", { cause: signal.reason });

/** Waits ms, or rejects as soon as the signal aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortedError(signal));
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortedError(signal!));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export function graphqlUrl(url: string): string {
  const base = url.replace(/\/+$/, "");
  return base.endsWith("/graphql") ? base : `${base}/graphql`;
}

/** One HTTP GraphQL endpoint with auth, per-attempt timeouts, caller aborts and retries. */
export class Transport {
  readonly endpoint: string;
  private readonly fetchImpl: typeof fetch;

  constructor(readonly options: TransportOptions) {
    this.endpoint = graphqlUrl(options.url);
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /**
   * Runs an operation. `idempotent` calls are retried on network errors, timeouts and 5xx with
   * exponential backoff; others run once, as a retry could apply them twice.
   */
  async request<T, V>(document: TypedDocumentNode<T, V>, variables: V, idempotent: boolean, call: CallOptions = {}): Promise<T> {
    const retries = idempotent ? (this.options.retries ?? 3) : 0;
    const backoff = this.options.backoffMs ?? 200;
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.attempt(document, variables, call);
      } catch (error) {
        const failure = error as EngramError;
        if (!(failure instanceof EngramError) || !failure.retryable || attempt >= retries) {
          if (failure instanceof EngramError) (failure.details as { attempts?: number }).attempts = attempt + 1;
          throw failure;
        }
        await sleep(backoff * 2 ** attempt * (0.5 + Math.random() / 2), call.signal);
      }
    }
  }

  private async attempt<T, V>(document: TypedDocumentNode<T, V>, variables: V, call: CallOptions): Promise<T> {
    if (call.signal?.aborted) throw abortedError(call.signal);
    const controller = new AbortController();
    const timeoutMs = call.timeoutMs ?? this.options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort();
    }, timeoutMs);
    const onAbort = () => controller.abort();
    call.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      let response: Response;
      let body: { data?: T | null; errors?: GraphQLErrorShape[] } | undefined;
      try {
        response = await this.fetchImpl(this.endpoint, {
          method: "POST",
          headers: {
            "content-type": "application/json",
            accept: "application/graphql-response+json, application/json",
            authorization: `Bearer ${this.options.apiKey}`,
          },
          body: JSON.stringify({ query: queryText(document), variables }),
          signal: controller.signal,
        });
        // Read whole inside the try: a body that stalls past the timeout, or an abort while it
        // arrives, is TIMEOUT or ABORTED like a missing answer; only an unreadable one is not JSON.
        body = parseJson(await response.text());
      } catch (error) {
        if (call.signal?.aborted) throw abortedError(call.signal);
        if (timedOut) throw new EngramError("TIMEOUT", `No answer from Engram within ${timeoutMs} ms.`, { cause: error });
        throw new EngramError("NETWORK_ERROR", `Could not reach Engram at ${this.endpoint}: ${(error as Error).message}`, { cause: error });
      }
      const first = body?.errors?.[0];
      if (first) {
        throw new EngramError(first.extensions?.code ?? "INTERNAL_SERVER_ERROR", first.message, {
          status: response.status,
          errors: body!.errors,
        });
      }
      if (!response.ok || !body?.data) {
        throw new EngramError("HTTP_ERROR", `Engram answered HTTP ${response.status}.`, { status: response.status });
      }
      return body.data;
    } finally {
      clearTimeout(timer);
      call.signal?.removeEventListener("abort", onAbort);
    }
  }
}

function parseJson<T>(text: string): T | undefined {
  try {
    return JSON.parse(text) as T;
  } catch {
    return undefined;
  }
}
