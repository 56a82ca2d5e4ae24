import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import { print } from "graphql";
import { createClient, type Client } from "graphql-ws";
import { SERVER_ROOT } from "./root.ts";

const KEY_STORAGE = "engram.inspector.key";

export type FailureKind = "unauthenticated" | "unreachable" | "forbidden" | "not-found" | "error";

/** A failed call, sorted into what the page tells people. */
export class ApiError extends Error {
  constructor(
    readonly kind: FailureKind,
    message: string,
    readonly code?: string,
  ) {
    super(message);
  }
}

/** "idle": no view is listening, so the socket is closed on purpose (graphql-ws is lazy). */
export type LiveStatus = "connecting" | "live" | "reconnecting" | "idle";

// localStorage, so every tab of this origin shares one sign-in (a Ctrl+click opens signed in);
// tabs hear each other's sign-in and sign-out through the storage event.
export const storedKey = () => localStorage.getItem(KEY_STORAGE);
export const storeKey = (key: string | null) =>
  key ? localStorage.setItem(KEY_STORAGE, key) : localStorage.removeItem(KEY_STORAGE);

/** Calls back when another tab signs in or out. */
export function onStoredKeyChange(listener: (key: string | null) => void) {
  const handler = (event: StorageEvent) => {
    if (event.key === KEY_STORAGE || event.key === null) listener(storedKey());
  };
  window.addEventListener("storage", handler);
  return () => window.removeEventListener("storage", handler);
}

const printed = new WeakMap<object, string>();
const source = (document: TypedDocumentNode<any, any>) => {
  let text = printed.get(document);
  if (!text) printed.set(document, (text = print(document)));
  return text;
};

function failureOf(errors: { message: string; extensions?: { code?: string } }[]): ApiError {
  const [first] = errors;
  const code = first.extensions?.code;
  const kind: FailureKind =
    code === "UNAUTHENTICATED" ? "unauthenticated" : code === "FORBIDDEN" ? "forbidden" : code === "NOT_FOUND" ? "not-found" : "error";
  return new ApiError(kind, first.message, code);
}

const isRefusal = (event: unknown) => {
  const code = (event as { code?: number } | null)?.code;
  return code === 4401 || code === 4403;
};

/**
 * One signed-in session: queries and mutations over HTTP, subscriptions over one graphql-ws
 * connection that retries for ever, so the page survives a server restart by itself.
 */
export class Engram {
  private ws: Client;
  private status: LiveStatus = "idle";
  private listeners = new Set<(status: LiveStatus) => void>();
  private resyncListeners = new Set<() => void>();
  private everConnected = false;
  /** The socket went away while subscriptions were open: what was announced meanwhile never reached the page. */
  private lost = false;
  /** Subscriptions open now: with none, a closed socket is the lazy close, not a lost server. */
  private active = 0;

  /** Told when the server refuses the key mid-session (revoked, or the tenant gone). */
  onRefused: () => void = () => {};

  constructor(
    readonly key: string,
    readonly server = SERVER_ROOT,
  ) {
    this.ws = createClient({
      url: new URL("graphql", server).href.replace(/^http/, "ws"),
      connectionParams: () => ({ authorization: `Bearer ${this.key}` }),
      lazy: true,
      keepAlive: 10_000,
      retryAttempts: Number.POSITIVE_INFINITY,
      // A refused key (4401/4403 from the server's connection check) is not retried: the page signs out.
      shouldRetry: (event) => !isRefusal(event),
      // Quick at first, then every 3 s: a restarted server is picked up within seconds.
      retryWait: (retries) => new Promise((resolve) => setTimeout(resolve, Math.min(250 * 2 ** retries, 3_000))),
      on: {
        connecting: () => this.setStatus(this.everConnected ? "reconnecting" : "connecting"),
        connected: () => {
          this.everConnected = true;
          this.setStatus("live");
          if (!this.lost) return;
          this.lost = false;
          for (const listener of this.resyncListeners) listener();
        },
        closed: (event) => {
          if (isRefusal(event)) return this.onRefused();
          if (this.active > 0) this.lost = true;
          this.setStatus(this.active === 0 ? "idle" : this.everConnected ? "reconnecting" : "connecting");
        },
      },
    });
  }

  private setStatus(status: LiveStatus) {
    this.status = status;
    for (const listener of this.listeners) listener(status);
  }

  get liveStatus() {
    return this.status;
  }

  onLiveStatus(listener: (status: LiveStatus) => void) {
    this.listeners.add(listener);
    return () => void this.listeners.delete(listener);
  }

  /**
   * Called when the socket is back after it was lost while subscriptions were open (a server
   * restart, a network drop): announcements of the gap are gone, so views read again.
   */
  onResync(listener: () => void) {
    this.resyncListeners.add(listener);
    return () => void this.resyncListeners.delete(listener);
  }

  async request<T, V>(document: TypedDocumentNode<T, V>, variables?: V): Promise<T> {
    let response: Response;
    try {
      response = await fetch(new URL("graphql", this.server), {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${this.key}` },
        body: JSON.stringify({ query: source(document), variables: variables ?? {} }),
      });
    } catch {
      throw new ApiError("unreachable", `Engram is not reachable at ${this.server.href}.`);
    }
    let body: { data?: T; errors?: { message: string; extensions?: { code?: string } }[] };
    try {
      body = await response.json();
    } catch {
      throw new ApiError(response.status >= 500 ? "unreachable" : "error", `Engram answered ${response.status}.`);
    }
    if (body.errors?.length) {
      const failure = failureOf(body.errors);
      if (failure.kind === "unauthenticated") this.onRefused();
      throw failure;
    }
    if (!body.data) throw new ApiError("error", "Engram returned no data.");
    return body.data;
  }

  /**
   * A file the server streams (a person's export, `export/users/<id>` below the server's root), as a Blob, with the
   * same failures as a query: the server answers typed errors in GraphQL's shape there too.
   */
  async download(path: string): Promise<Blob> {
    let response: Response;
    try {
      response = await fetch(new URL(path, this.server), { headers: { authorization: `Bearer ${this.key}` } });
    } catch {
      throw new ApiError("unreachable", `Engram is not reachable at ${this.server.href}.`);
    }
    if (response.ok) {
      try {
        return await response.blob();
      } catch {
        // The server cuts a failed export short rather than end it as if whole.
        throw new ApiError("unreachable", "The export was cut short before its end; try again.");
      }
    }
    let errors: { message: string; extensions?: { code?: string } }[] | undefined;
    try {
      errors = (await response.json()).errors;
    } catch {
      // Not JSON: said by its status below.
    }
    if (!errors?.length) throw new ApiError(response.status >= 500 ? "unreachable" : "error", `Engram answered ${response.status}.`);
    const failure = failureOf(errors);
    if (failure.kind === "unauthenticated") this.onRefused();
    throw failure;
  }

  subscribe<T, V>(
    document: TypedDocumentNode<T, V>,
    variables: V,
    sink: { next(data: T): void; error?(error: ApiError): void },
  ): () => void {
    this.active += 1;
    let open = true;
    let unsubscribe = () => {};
    const start = () => {
      unsubscribe = this.ws.subscribe<T>(
        { query: source(document), variables: variables as Record<string, unknown> },
        {
          next: (result) => {
            if (result.errors?.length) {
              const failure = failureOf(result.errors as never);
              if (failure.kind === "unauthenticated") this.onRefused();
              sink.error?.(failure);
            }
            else if (result.data) sink.next(result.data as T);
          },
          error: (error) => {
            const failure = Array.isArray(error) ? failureOf(error) : new ApiError("error", String(error));
            // The server ended it in a burst it could not keep up with: listen again, and read what went by.
            if (failure.code === "SUBSCRIBER_TOO_SLOW" && open) {
              start();
              for (const listener of this.resyncListeners) listener();
              return;
            }
            sink.error?.(failure);
          },
          complete: () => {},
        },
      );
    };
    start();
    return () => {
      if (!open) return;
      open = false;
      this.active -= 1;
      unsubscribe();
    };
  }

  async close() {
    await this.ws.dispose();
  }
}
