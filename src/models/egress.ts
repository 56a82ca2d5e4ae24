import { AsyncLocalStorage } from "node:async_hooks";
import { lookup as dnsLookup, type LookupAddress } from "node:dns";
import http from "node:http";
import https from "node:https";
import { isIP, type LookupFunction } from "node:net";
import { Readable } from "node:stream";
import { ContextOverflowError } from "@langchain/core/errors";
import { EngramError } from "../errors.ts";
import { TimedOut, withTimeout } from "../timeout.ts";

/**
 * Where model calls may go. Tenant-set base URLs must not reach the operator's own network
 * (SSRF): the address actually connected to is checked, so a DNS name that resolves (or
 * re-resolves) to a private address is refused too. Redirects are never followed and a
 * provider's error body never leaves this module.
 */
export type EgressPolicy = {
  /** Hosts ("host" or "host:port", lower case) that may be private: the operator's choice. */
  allowed: string[];
};

/** A model call that failed: its message is a short typed reason, never the provider's body. */
export class ModelCallError extends EngramError {
  constructor(
    reason: string,
    /**
     * "refused": retrying the same call cannot help (the route is not allowed, or the request is
     * past the model's context: 413, or a 400/422 saying so); "failed": the call went wrong.
     */
    readonly kind: "refused" | "failed" = "failed",
  ) {
    super("MODEL_UNAVAILABLE", reason);
    this.name = "ModelCallError";
  }
}

/** Parses ENGRAM_MODEL_HOST_ALLOWLIST: comma-separated host or host:port ([v6]:port for IPv6). */
export function parseHostAllowlist(value: string | undefined): string[] {
  return (value ?? "")
    .split(",")
    .map((entry) => entry.trim().toLowerCase())
    .filter(Boolean);
}

/** The policy for a server: the allow-list, plus the host of the operator's own OPENAI_BASE_URL. */
export function egressPolicy(env: { ENGRAM_MODEL_HOST_ALLOWLIST?: string; OPENAI_BASE_URL?: string }): EgressPolicy {
  const allowed = parseHostAllowlist(env.ENGRAM_MODEL_HOST_ALLOWLIST);
  if (env.OPENAI_BASE_URL) allowed.push(hostPort(new URL(env.OPENAI_BASE_URL)));
  return { allowed };
}

const bare = (hostname: string) => hostname.replace(/^\[|\]$/g, "").toLowerCase();

function hostPort(url: URL): string {
  const port = url.port || (url.protocol === "https:" ? "443" : "80");
  const host = bare(url.hostname);
  return isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`;
}

export function isAllowlisted(policy: EgressPolicy, url: URL): boolean {
  const host = bare(url.hostname);
  const withPort = hostPort(url);
  return policy.allowed.some((entry) => bare(entry) === host || entry === withPort);
}

// ---------------------------------------------------------------------------------------------
// Address ranges

type Range = [bigint, number];

function ipv4ToBigInt(address: string): bigint {
  return address.split(".").reduce((n, part) => (n << 8n) | BigInt(Number(part)), 0n);
}

function ipv6ToBigInt(address: string): bigint {
  let text = address.toLowerCase().split("%")[0];
  // A dotted IPv4 tail (::ffff:1.2.3.4) becomes two hex groups.
  const dotted = text.match(/(\d+\.\d+\.\d+\.\d+)$/);
  if (dotted) {
    const v4 = ipv4ToBigInt(dotted[1]);
    text = `${text.slice(0, -dotted[1].length)}${(v4 >> 16n).toString(16)}:${(v4 & 0xffffn).toString(16)}`;
  }
  const [head, tail] = text.split("::");
  const headGroups = head ? head.split(":") : [];
  const tailGroups = tail !== undefined && tail !== "" ? tail.split(":") : [];
  const missing = 8 - headGroups.length - tailGroups.length;
  const groups = tail === undefined ? headGroups : [...headGroups, ...Array(missing).fill("0"), ...tailGroups];
  return groups.reduce((n, group) => (n << 16n) | BigInt(parseInt(group || "0", 16)), 0n);
}

const v4 = (cidr: string): Range => {
  const [address, bits] = cidr.split("/");
  return [ipv4ToBigInt(address), Number(bits)];
};
const v6 = (cidr: string): Range => {
  const [address, bits] = cidr.split("/");
  return [ipv6ToBigInt(address), Number(bits)];
};

/** Not the public internet: unspecified, loopback, private, shared, link-local (metadata), reserved. */
const BLOCKED_V4: Range[] = [
  "0.0.0.0/8",
  "10.0.0.0/8",
  "100.64.0.0/10",
  "127.0.0.0/8",
  "169.254.0.0/16",
  "172.16.0.0/12",
  "192.0.0.0/24",
  "192.0.2.0/24",
  "192.168.0.0/16",
  "198.18.0.0/15",
  "198.51.100.0/24",
  "203.0.113.0/24",
  "224.0.0.0/4",
  "240.0.0.0/4",
].map(v4);

const BLOCKED_V6: Range[] = [
  "::/128",
  "::1/128",
  "::ffff:0:0:0/96", // IPv4-translated (SIIT): an IPv4 address inside, as with the mapped form
  "64:ff9b:1::/48", // local-use NAT64, which a network may route anywhere inside it
  "100::/64",
  "2001::/32", // Teredo: an (obfuscated) IPv4 address inside
  "2001:db8::/32",
  "fc00::/7", // unique-local, which holds the EC2 metadata address fd00:ec2::254
  "fe80::/10",
  "fec0::/10",
  "ff00::/8",
].map(v6);

const inRange = (value: bigint, width: number, [base, bits]: Range) =>
  value >> BigInt(width - bits) === base >> BigInt(width - bits);

/** Whether an IP address is outside the public internet (IPv4 inside IPv6 forms included). */
export function isPrivateAddress(address: string): boolean {
  const family = isIP(bare(address));
  if (family === 4) {
    const value = ipv4ToBigInt(bare(address));
    return BLOCKED_V4.some((range) => inRange(value, 32, range));
  }
  if (family !== 6) return true;
  const value = ipv6ToBigInt(bare(address));
  const embedded = (v: bigint) => [Number((v >> 24n) & 255n), Number((v >> 16n) & 255n), Number((v >> 8n) & 255n), Number(v & 255n)].join(".");
  // IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d): judge the IPv4.
  if (value >> 32n === 0xffffn || value >> 32n === 0n || value >> 32n === 0x64ff9b0000000000000000n) {
    if (value > 1n) return isPrivateAddress(embedded(value & 0xffffffffn));
  }
  // 6to4 (2002:a.b.c.d::/48)
  if (value >> 112n === 0x2002n) return isPrivateAddress(embedded((value >> 80n) & 0xffffffffn));
  return BLOCKED_V6.some((range) => inRange(value, 128, range));
}

const refusal = (host: string) =>
  new ModelCallError(
    `model host ${host} is on a private, loopback or link-local network; the operator can allow it with ENGRAM_MODEL_HOST_ALLOWLIST`,
    "refused",
  );

/**
 * Why a base URL may not be used, judged without DNS (settings time): credentials, a query or a
 * fragment in it, or an address or name that is plainly not public. Null when it may be tried; calls check again.
 */
export function baseUrlProblem(policy: EgressPolicy, raw: string): string | null {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return "must be a URL";
  }
  if (url.username || url.password) return "must not contain credentials (user:password@); set apiKey instead";
  if (url.protocol !== "http:" && url.protocol !== "https:") return "must be an http(s) URL";
  // The client appends its own paths to the base URL: a query or fragment would only carry what
  // the tenant put there to whatever host it names (the operator's allow-listed ones included).
  if (url.search || url.hash || /[?#]/.test(raw)) return "must not contain a query (?…) or fragment (#…)";
  if (isAllowlisted(policy, url)) return null;
  const host = bare(url.hostname);
  if (isIP(host) ? isPrivateAddress(host) : host === "localhost" || host.endsWith(".localhost")) {
    return refusal(host).message;
  }
  return null;
}

/** A URL as it may be shown or stored: without user:password@. */
export function withoutCredentials(raw: string): string {
  try {
    const url = new URL(raw);
    if (!url.username && !url.password) return raw;
    url.username = "";
    url.password = "";
    return url.toString();
  } catch {
    return raw;
  }
}

// ---------------------------------------------------------------------------------------------
// The fetch given to every OpenAI client

/**
 * What a call is told when its host's name does not lead to a public address: the same words
 * whether the name is unknown or resolves to a private one, so that a tenant cannot use its route
 * to learn which names the server's own network knows (the operator's log has which it was).
 */
const notPublic = (host: string, kind: ModelCallError["kind"]) =>
  new ModelCallError(
    `model host ${host} did not resolve to a public address (it is unknown, or on a private, loopback or link-local network); the operator can allow a private host with ENGRAM_MODEL_HOST_ALLOWLIST`,
    kind,
  );

/** Node's `lookup` for a connection to `host`: refuses it unless every address it resolves to is public. */
export function guardedLookup(host: string, resolve: typeof dnsLookup = dnsLookup, onRefusal?: (why: string) => void): LookupFunction {
  return (hostname, options, callback) => {
    resolve(hostname, { ...options, all: true }, (error, addresses) => {
      const list = (addresses ?? []) as unknown as LookupAddress[];
      const why = error ? `lookup failed (${error.code ?? error.message})` : list.length === 0 ? "no address" : list.some((a) => isPrivateAddress(a.address)) ? "a private address" : null;
      if (why) {
        onRefusal?.(why);
        // A failed lookup may work on a later try (a resolver's outage); a private address never.
        return callback(notPublic(host, error ? "failed" : "refused") as unknown as NodeJS.ErrnoException, "", 0);
      }
      if (options.all) return (callback as unknown as (e: null, a: LookupAddress[]) => void)(null, list);
      callback(null, list[0].address, list[0].family);
    });
  };
}

/**
 * The connections of calls whose addresses were checked, kept apart from Node's shared agent: a
 * connection is checked once, when it is made, so one reused from the shared pool (another
 * part of the process's request to the same host and port) would have skipped the check.
 */
const CHECKED_AGENTS = { "http:": new http.Agent({ keepAlive: true }), "https:": new https.Agent({ keepAlive: true }) };

const NULL_BODY = new Set([101, 204, 205, 304]);

/**
 * How a provider says that a request is past its model's context (OpenAI, vLLM, LiteLLM, llama.cpp,
 * Ollama and Anthropic-style wordings): no retry of that request changes it, where any other 400
 * or 422 may be the route's own fault (a parameter the model does not take, an unknown model),
 * which the operator fixes and a retry then gets through.
 */
const CONTEXT_OVERFLOW =
  /context_length_exceeded|maximum context length|context window|context length|too many tokens|prompt is too long|input is too long|exceeds? the (?:model'?s? )?(?:maximum|max|configured)|input tokens exceed/i;

/** How much of an error answer is read to tell a context overflow (the rest is drained unread). */
const ERROR_HEAD_BYTES = 16_384;

/** The client's words for it (OpenAI's error code): it reads them as a ContextOverflowError. */
const OVERFLOW_CODE = "context_length_exceeded";

/**
 * Any failed model call as a ModelCallError with a short reason: provider bodies and internal
 * messages stay out of job runs, logs and GraphQL errors.
 */
export function asModelCallError(error: unknown): ModelCallError {
  // The client wraps what fetch threw (a refusal, a redirect) as the cause of its own error.
  for (let cause = error, depth = 0; cause && depth < 5; cause = (cause as { cause?: unknown }).cause, depth++) {
    if (cause instanceof ModelCallError) return cause;
  }
  const e = error as { status?: unknown; name?: string; code?: string; message?: string; cause?: { status?: unknown } };
  if (error instanceof ContextOverflowError || e?.code === OVERFLOW_CODE) {
    const status = typeof e.status === "number" ? e.status : e.cause?.status;
    return new ModelCallError(`model provider answered ${status ?? 400}: the request is past the model's context`, "refused");
  }
  if (typeof e?.status === "number") return new ModelCallError(`model provider answered ${e.status}`);
  const name = `${e?.name ?? ""} ${e?.code ?? ""} ${e?.message ?? ""}`;
  if (/timeout|timed out|AbortError/i.test(name)) return new ModelCallError("model provider did not answer in time");
  if (/ECONNREFUSED|ENOTFOUND|EAI_AGAIN|ECONNRESET|EHOSTUNREACH|ENETUNREACH|Connection error/i.test(name)) {
    return new ModelCallError("model provider unreachable");
  }
  return new ModelCallError("model call failed");
}

/**
 * The most a model answer may hold. The client reads an answer whole before parsing it, so a
 * provider that keeps sending (a tenant's own endpoint can) filled the server's memory until the
 * call's deadline. The longest chat answer a chain asks for is a few KB; an embeddings answer is
 * at most 64 texts (the indexer's batch) of a few thousand floats, about 6 MB.
 */
export const MODEL_ANSWER_MAX_BYTES = { chat: 2 * 1024 * 1024, embeddings: 32 * 1024 * 1024 };

/**
 * What one model call's requests came to, as a provider bills them: how many reached it whole,
 * and how many of those it answered with an error status (which providers do not bill).
 */
export type Exchanges = { sent: number; refused: number };

const exchanges = new AsyncLocalStorage<Exchanges>();

/** Runs a model call, counting into `noted` its requests that guardedFetch sends. */
export const noteExchanges = <T>(noted: Exchanges, call: () => Promise<T>): Promise<T> => exchanges.run(noted, call);

/** How many of a call's requests reached the provider whole and got no answer, each of which it may bill. */
export const unansweredRequests = (noted: Exchanges) => Math.max(0, noted.sent - noted.refused);

/**
 * Whether a call that failed may be billed all the same: a request of it reached the provider
 * whole and was not refused (it timed out, stalled, or its answer was cut off). A connection that
 * never opened, or a request still being written, cost nothing.
 */
export const billedUnanswered = (noted: Exchanges) => unansweredRequests(noted) > 0;

/**
 * fetch for the OpenAI client: checks the host (and every address it resolves to) against the
 * policy, never follows a redirect, replaces an error response's body with its status, ends an
 * exchange that receives nothing for `idleTimeoutMs`, its body included, and one whose body
 * passes `maxBodyBytes`.
 */
export function guardedFetch(
  policy: EgressPolicy,
  bounds: { idleTimeoutMs: number; maxBodyBytes: number },
  /** Told, for the operator's log, why a host's name was refused (the call's error does not say). */
  log?: (host: string, why: string) => void,
): typeof fetch {
  return async (input, init) => {
    const request = new Request(input, init);
    const url = new URL(request.url);
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new ModelCallError("model base URL must be http(s)", "refused");
    if (url.username || url.password) throw new ModelCallError("model base URL must not contain credentials", "refused");
    const allowed = isAllowlisted(policy, url);
    const host = bare(url.hostname);
    if (!allowed && isIP(host) && isPrivateAddress(host)) throw refusal(host);
    const body = request.body ? Buffer.from(await request.arrayBuffer()) : undefined;
    const headers = Object.fromEntries(request.headers);
    // Node's http client does not decompress: ask for plain bodies.
    delete headers["accept-encoding"];
    request.signal.throwIfAborted();
    const noted = exchanges.getStore();
    return new Promise<Response>((resolve, reject) => {
      const client = url.protocol === "https:" ? https : http;
      let received: http.IncomingMessage | undefined;
      const outgoing = client.request(
        url,
        {
          method: request.method,
          headers,
          signal: request.signal,
          timeout: bounds.idleTimeoutMs,
          // An allow-listed host may use the shared pool; any other connection is one this module checked.
          ...(allowed ? {} : { agent: CHECKED_AGENTS[url.protocol as keyof typeof CHECKED_AGENTS] }),
          ...(allowed || isIP(host) ? {} : { lookup: guardedLookup(host, dnsLookup, (why) => log?.(host, why)) }),
        },
        (incoming) => {
          received = incoming;
          const status = incoming.statusCode ?? 502;
          const responseHeaders = new Headers();
          for (const [name, value] of Object.entries(incoming.headers)) {
            if (value === undefined || name === "content-length" || name === "content-encoding") continue;
            for (const v of Array.isArray(value) ? value : [value]) responseHeaders.append(name, v);
          }
          const tooLarge = () => new ModelCallError(`model provider's answer is larger than ${bounds.maxBodyBytes} bytes`);
          // Counted on every answer, an error body that is drained unread too: one that never
          // ends would otherwise keep its connection pumping after the call is over.
          let bytes = 0;
          let handedOn = false;
          incoming.on("data", (chunk: Buffer) => {
            bytes += chunk.length;
            // Only a body handed on has a reader to hear why it was cut.
            if (bytes > bounds.maxBodyBytes) incoming.destroy(handedOn ? tooLarge() : undefined);
          });
          if (status >= 300 && noted) noted.refused++;
          if (status >= 300 && status < 400) {
            incoming.resume();
            reject(new ModelCallError(`model provider answered ${status} (a redirect, which is not followed)`));
            return;
          }
          if (status >= 400) {
            // The provider's words stay here: only whether they say the request is past the
            // model's context goes on, as OpenAI's code for it (413 says so by itself).
            const head: Buffer[] = [];
            let headBytes = 0;
            let answered = false;
            const answer = () => {
              if (answered) return;
              answered = true;
              const overflow = status === 413 || ((status === 400 || status === 422) && CONTEXT_OVERFLOW.test(Buffer.concat(head).toString("utf8")));
              const reason = `model provider answered ${status}`;
              const error = overflow ? { message: `${reason}: ${OVERFLOW_CODE}`, code: OVERFLOW_CODE } : { message: reason };
              responseHeaders.set("content-type", "application/json");
              resolve(new Response(JSON.stringify({ error }), { status, headers: responseHeaders }));
            };
            incoming.on("data", (chunk: Buffer) => {
              if (headBytes < ERROR_HEAD_BYTES) head.push(chunk);
              headBytes += chunk.length;
              if (headBytes >= ERROR_HEAD_BYTES) answer();
            });
            incoming.on("end", answer).on("close", answer).on("error", answer);
            return;
          }
          if (Number(incoming.headers["content-length"]) > bounds.maxBodyBytes) {
            incoming.destroy();
            reject(tooLarge());
            return;
          }
          handedOn = true;
          const stream = NULL_BODY.has(status) ? null : (Readable.toWeb(incoming) as ReadableStream<Uint8Array>);
          if (!stream) incoming.resume();
          resolve(new Response(stream, { status, headers: responseHeaders }));
        },
      );
      // The client's own timeout stops once the headers are in: a provider that then stalls in
      // its body would otherwise hold the call, and whatever its caller holds, for ever.
      outgoing.on("timeout", () => {
        const stalled = new ModelCallError(`model provider stalled: nothing received for ${bounds.idleTimeoutMs} ms`);
        received?.destroy(stalled);
        outgoing.destroy(stalled);
      });
      outgoing.on("error", reject);
      // Flushed to the connection whole: from here the provider may read it, and bill it.
      if (noted) outgoing.on("finish", () => noted.sent++);
      outgoing.end(body);
    });
  };
}

// ---------------------------------------------------------------------------------------------
// Deadlines

/**
 * The abort signal of the reply an embedding call is made for (call-budget.ts): LangChain's
 * Embeddings take no per-call options, so the metered embedder hears its caller's abort here.
 */
export const replySignal = new AsyncLocalStorage<AbortSignal>();

/**
 * How long one model call may take in all: every attempt its whole timeout, and LangChain's
 * pauses between retries at their longest (1–2 s, doubling each time).
 */
export function modelCallDeadlineMs(env: { ENGRAM_MODEL_TIMEOUT_MS: number; ENGRAM_MODEL_MAX_RETRIES: number }): number {
  const retries = env.ENGRAM_MODEL_MAX_RETRIES;
  return (retries + 1) * env.ENGRAM_MODEL_TIMEOUT_MS + 2_000 * (2 ** retries - 1);
}

/**
 * Runs a model call that must end within `deadlineMs`: past it the call fails with a
 * ModelCallError (an outage to its callers) and its signal aborts, so the request it still has
 * open is torn down. A call that ignores the signal no longer holds its caller either way.
 */
export async function withinDeadline<T>(
  deadlineMs: number,
  call: (signal: AbortSignal) => Promise<T>,
  outer?: AbortSignal,
  /** Whose deadline it is, for the error: the call's own, or the reply's a request waits on. */
  whose = "for the call, retries included",
  /** The deadline as configured, for the error, when this call was given what was left of it. */
  statedMs = deadlineMs,
): Promise<T> {
  const controller = new AbortController();
  const forward = () => controller.abort(outer?.reason);
  outer?.addEventListener("abort", forward, { once: true });
  try {
    return await withTimeout(call(controller.signal), deadlineMs, `no answer within ${deadlineMs} ms`);
  } catch (error) {
    if (!(error instanceof TimedOut)) throw error;
    controller.abort(error);
    throw new ModelCallError(`model provider did not answer in time (${statedMs} ms ${whose})`);
  } finally {
    outer?.removeEventListener("abort", forward);
  }
}
