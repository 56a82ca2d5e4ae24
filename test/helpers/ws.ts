import { createClient, type Client } from "graphql-ws";
import WebSocket from "ws";

/** A graphql-ws client on the test server, with the key sent as a connection parameter. */
export function wsClient(httpUrl: string, key: string | null): Client {
  return createClient({
    url: `${httpUrl.replace(/^http/, "ws")}/graphql`,
    webSocketImpl: WebSocket,
    connectionParams: key ? { authorization: `Bearer ${key}` } : {},
    retryAttempts: 0,
    lazy: true,
  });
}

/** Subscribes and collects results; `next()` waits for the next one. */
export function collect<T = any>(client: Client, query: string, variables?: Record<string, unknown>) {
  const received: { data?: T; errors?: readonly { message: string; extensions?: Record<string, unknown> }[] }[] = [];
  const waiters: (() => void)[] = [];
  let failure: unknown;
  const dispose = client.subscribe<T>(
    { query, variables },
    {
      next: (value) => {
        received.push(value as never);
        waiters.splice(0).forEach((w) => w());
      },
      error: (error) => {
        failure = error;
        waiters.splice(0).forEach((w) => w());
      },
      complete: () => waiters.splice(0).forEach((w) => w()),
    },
  );
  return {
    received,
    dispose,
    get failure() {
      return failure;
    },
    async next(count = 1, timeoutMs = 10_000) {
      const deadline = Date.now() + timeoutMs;
      while (received.length < count && !failure) {
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${count} results`);
        await new Promise<void>((resolve) => {
          waiters.push(resolve);
          setTimeout(resolve, 100);
        });
      }
      return received[count - 1];
    },
  };
}

/** Resolves once the subscription is set up on the server (a ping round-trip after subscribe). */
export const settle = (ms = 300) => new Promise((resolve) => setTimeout(resolve, ms));
