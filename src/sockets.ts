import { EventEmitter } from "node:events";
import { GraphQLError, type ExecutionResult } from "graphql";
import type { Plugin } from "graphql-yoga";
import type { PubSub } from "./pubsub.ts";

/** Close codes a WebSocket client can act on. */
export const CLOSE = { revoked: 4401, tooManyConnections: 4429 } as const;

/** How often open sockets' keys are checked against the store, in case an announcement was lost. */
export const KEY_SWEEP_MS = 500;

/** A connection the registry can close: a WebSocket, or a subscription's stream over HTTP (SSE). */
export type Connection = {
  close(code: number, reason: string): void;
  once(event: "close", listener: () => void): unknown;
};

export type SocketRegistry = ReturnType<typeof createSocketRegistry>;

/**
 * The open connections of each API key (WebSockets, and subscriptions' streams over HTTP: see
 * useStreamsOfLiveKeys): bounded per key, and closed as soon as the key is
 * revoked on any instance (revocations travel on the pubsub, through Redis when it is set). An
 * announcement can be lost (Redis down, or no Redis between instances), so every KEY_SWEEP_MS the
 * keys with open sockets are also checked in one statement: a revoked key loses its sockets
 * within about a second on every instance even then.
 */
export function createSocketRegistry(
  pubsub: Pick<PubSub, "subscribe">,
  limits: { connectionsPerKey: number },
  /** Of the given key ids, those still valid (not revoked, tenant active). */
  liveKeyIds: (ids: string[]) => Promise<string[]>,
  log: { warn(message: string, fields?: Record<string, unknown>): void },
) {
  const byKey = new Map<string, Set<Connection>>();
  const closeKey = (apiKeyId: string) => {
    for (const socket of byKey.get(apiKeyId) ?? []) socket.close(CLOSE.revoked, "API key revoked");
    byKey.delete(apiKeyId);
  };
  const revocations = pubsub.subscribe("apiKeyRevoked", "all");
  void (async () => {
    for await (const { apiKeyId } of revocations) closeKey(apiKeyId);
  })().catch(() => undefined);

  let sweeping = false;
  const sweep = setInterval(() => {
    if (sweeping || byKey.size === 0) return;
    sweeping = true;
    const ids = [...byKey.keys()];
    liveKeyIds(ids)
      .then((live) => {
        const valid = new Set(live);
        for (const id of ids) if (!valid.has(id)) closeKey(id);
      })
      // The store being down closes nothing: the next sweep tries again.
      .catch((error: unknown) => log.warn("could not check the keys of open WebSockets", { error }))
      .finally(() => (sweeping = false));
  }, KEY_SWEEP_MS);
  sweep.unref();

  return {
    /** Registers a connection for a key; false (and the connection closed) when the key has too many. */
    add(apiKeyId: string, socket: Connection): boolean {
      const sockets = byKey.get(apiKeyId) ?? new Set<Connection>();
      if (sockets.size >= limits.connectionsPerKey) {
        socket.close(CLOSE.tooManyConnections, `Too many connections for this API key (at most ${limits.connectionsPerKey})`);
        return false;
      }
      sockets.add(socket);
      byKey.set(apiKeyId, sockets);
      socket.once("close", () => {
        sockets.delete(socket);
        if (sockets.size === 0 && byKey.get(apiKeyId) === sockets) byKey.delete(apiKeyId);
      });
      return true;
    },
    async close() {
      clearInterval(sweep);
      await revocations.return?.();
    },
  };
}

/** A subscription's stream over HTTP, as the registry sees it: closing it ends the stream. */
class HttpStream extends EventEmitter implements Connection {
  reason: string | null = null;
  readonly closed: Promise<string>;
  private closeWith!: (reason: string) => void;

  constructor() {
    super();
    this.closed = new Promise((resolve) => (this.closeWith = resolve));
  }

  close(_code: number, reason: string) {
    this.reason = reason;
    this.closeWith(reason);
  }

  /** The stream ended (its client left, it ran out, or it was closed): the registry forgets it. */
  ended() {
    this.emit("close");
  }
}

/**
 * The source's results until `stream` is closed; then one error saying why, and the end. An
 * iterator of its own rather than an async generator: a generator waiting on the source cannot
 * be returned (the client left) until the source yields, and a quiet subscription never does.
 */
function untilClosed(source: AsyncIterable<ExecutionResult>, stream: HttpStream): AsyncIterableIterator<ExecutionResult> {
  const results = source[Symbol.asyncIterator]();
  // The wait of the next() under way, ended by the close. (Racing every next() against the one
  // close promise would leave a reaction on it per result for as long as the stream is open.)
  let wake: ((closed: null) => void) | null = null;
  let closed = false;
  void stream.closed.then(() => {
    closed = true;
    wake?.(null);
  });
  let finished = false;
  const finish = async (): Promise<IteratorResult<ExecutionResult>> => {
    if (!finished) {
      finished = true;
      stream.ended();
      await results.return?.();
    }
    return { done: true, value: undefined };
  };
  return {
    async next() {
      if (finished) return { done: true, value: undefined };
      const next = closed
        ? null
        : await new Promise<IteratorResult<ExecutionResult> | null>((resolve, reject) => {
            wake = resolve;
            results.next().then(resolve, reject);
          }).finally(() => (wake = null));
      if (next && !next.done) return next;
      const reason = next === null ? stream.reason : null;
      await finish();
      return reason
        ? { done: false, value: { errors: [new GraphQLError(reason, { extensions: { code: "UNAUTHENTICATED" } })] } }
        : { done: true, value: undefined };
    },
    return: finish,
    [Symbol.asyncIterator]() {
      return this;
    },
  };
}

/**
 * Subscriptions over HTTP (Server-Sent Events, which yoga serves on the same path) are held to
 * the same rules as WebSockets: each is a connection of its key in the registry, counted against
 * the key's connections, and ended (with an UNAUTHENTICATED error) as soon as the key is revoked.
 * A WebSocket's subscriptions need nothing here: the registry closes their socket.
 */
export function useStreamsOfLiveKeys(registry: Pick<SocketRegistry, "add">, limits: { connectionsPerKey: number }): Plugin {
  return {
    onSubscribe({ args, setResultAndStopExecution }) {
      const context = args.contextValue as { socket?: unknown; principal?: { apiKeyId: string } };
      if (context.socket || !context.principal) return;
      const stream = new HttpStream();
      if (!registry.add(context.principal.apiKeyId, stream)) {
        const message = `Too many connections for this API key (at most ${limits.connectionsPerKey})`;
        setResultAndStopExecution({ errors: [new GraphQLError(message, { extensions: { code: "TOO_MANY_CONNECTIONS" } })] });
        return;
      }
      return {
        onSubscribeResult({ result, setResult }) {
          if (Symbol.asyncIterator in result) setResult(untilClosed(result, stream));
          else stream.ended();
        },
        onSubscribeError() {
          stream.ended();
        },
      };
    },
  };
}
