import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { maxAliasesPlugin } from "@escape.tech/graphql-armor-max-aliases";
import { maxDepthPlugin } from "@escape.tech/graphql-armor-max-depth";
import { GraphQLError } from "graphql";
import { useServer } from "graphql-ws/use/ws";
import { createYoga, maskError as defaultMaskError, type Plugin, type YogaServerInstance } from "graphql-yoga";
import { WebSocketServer, type WebSocket } from "ws";
import type { GraphQLContext } from "./builder.ts";
import { forTenant } from "./db.ts";
import { EngramError } from "./errors.ts";
import { exportHandler, isExportPath } from "./export-http.ts";
import { checkHealth, freeBytes } from "./health.ts";
import { isInputValidationError, reportLimitErrors, useQueryCost, useTypedRequestErrors } from "./graphql/edge.ts";
import { schema } from "./graphql/index.ts";
import { serveInspector } from "./inspector.ts";
import { liveKeyIds, type Caller } from "./auth.ts";
import { modelCallBudget, modelsForRequest } from "./models/call-budget.ts";
import { MCP_PATH, mcpHandler } from "./mcp/http.ts";
import { restApi } from "./rest.ts";
import { LIMITS } from "./limits.ts";
import type { Services } from "./services.ts";
import { createSocketRegistry, useStreamsOfLiveKeys } from "./sockets.ts";
import { corsFor, corsHeaders, HTTP_TIMEOUTS, parseOrigins, useCachedGraphiQL } from "./http-hardening.ts";

const GRAPHQL_PATH = "/graphql";

/**
 * At shutdown, requests in flight get this long to finish before their connections are closed:
 * long enough for a recall waiting on a model, short enough to leave the jobs and the store
 * their share of the shutdown's 9 s (src/server.ts).
 */
export const HTTP_DRAIN_MS = 3_000;

/**
 * A subscription's event stream never ends by itself: at shutdown it is closed, not waited for.
 * Marked as yoga answers it: its Node adapter writes the headers with writeHead, so the
 * response's own getHeader never sees the content type (every open stream held shutdown 3 s).
 */
function useEventStreamMarks(streams: WeakSet<ServerResponse>): Plugin {
  return {
    onResponse({ response, serverContext }) {
      const res = (serverContext as { res?: ServerResponse } | undefined)?.res;
      if (res && response.headers.get("content-type")?.startsWith("text/event-stream")) streams.add(res);
    },
  };
}

export type InitialContext = {
  request?: Request;
  connectionParams?: Record<string, unknown>;
};

function authorizationOf(initial: InitialContext): string | null {
  const params = initial.connectionParams ?? {};
  const fromParams = Object.entries(params).find(([key]) => key.toLowerCase() === "authorization")?.[1];
  if (typeof fromParams === "string") return fromParams;
  return initial.request?.headers.get("authorization") ?? null;
}

/**
 * The key of a request is checked before anything reads its body: yoga parses and validates a
 * document (and keeps it in its cache) before the context is built, so without a key a megabyte
 * of fields would still be parsed, cached and answered with the schema's field names. Every path
 * yoga serves is checked (it takes "/graphql/" and any URL ending in "/graphql" as its endpoint
 * too, /memory/graphql included), the REST paths and their OpenAPI document too, but a browser's
 * preflight (OPTIONS); GraphiQL's page is served before this.
 */
function useKeyFirst(authenticate: Services["keys"]["authenticate"], checked: WeakMap<Request, Caller>, log: Services["log"]): Plugin {
  return {
    async onRequest({ request, endResponse, fetchAPI }) {
      if (request.method === "OPTIONS") return;
      const answer = (status: number, message: string, code: string) =>
        endResponse(
          new fetchAPI.Response(JSON.stringify({ errors: [{ message, extensions: { code } }] }), {
            status,
            headers: { "content-type": "application/json; charset=utf-8" },
          }),
        );
      let caller: Caller | null;
      try {
        caller = await authenticate(request.headers.get("authorization"));
      } catch (error) {
        // Thrown from onRequest, it would reach the server adapter, which answers with its stack.
        log.error("key lookup failed", { error });
        return answer(500, "Unexpected error.", "INTERNAL_SERVER_ERROR");
      }
      if (caller) {
        checked.set(request, caller);
        return;
      }
      const { message, extensions } = unauthenticated();
      answer(401, message, extensions.code as string);
    },
  };
}

const unauthenticated = () =>
  new GraphQLError("A valid API key is required: send `Authorization: Bearer <key>`.", {
    extensions: { code: "UNAUTHENTICATED", http: { status: 401 } },
  });

// graphql ships CJS and ESM builds and both get loaded, so GraphQLErrors are recognised by name.
const isGraphQLError = (error: unknown): error is GraphQLError =>
  error instanceof Error && error.name === "GraphQLError";

/** The error a resolver threw, under the GraphQLErrors that located it. */
function rootCause(error: unknown): unknown {
  let current = error;
  while (isGraphQLError(current) && current.originalError) current = current.originalError;
  return current;
}

/** Expected failures keep their code and message; everything else is logged and masked. */
function maskError(error: unknown, message: string, isDev: boolean | undefined, log: Services["log"]) {
  const located = isGraphQLError(error) ? error : undefined;
  const cause = rootCause(error);
  const where = { nodes: located?.nodes, path: located?.path };
  if (cause instanceof EngramError) {
    return new GraphQLError(cause.message, { ...where, extensions: { code: cause.code, ...cause.details } });
  }
  if (isInputValidationError(cause)) {
    return new GraphQLError(cause.message, { ...where, extensions: { ...cause.extensions, code: "BAD_USER_INPUT" } });
  }
  if (isGraphQLError(cause)) {
    return new GraphQLError(cause.message, { ...where, extensions: cause.extensions });
  }
  log.error("unexpected error in a GraphQL operation", {
    error: cause,
    stack: (cause as Error)?.stack?.split("\n").slice(0, 6).join(" | "),
  });
  return defaultMaskError(error, message, isDev);
}

/**
 * Bodies are capped before anything reads them: over the limit is 413, and a body without a
 * declared length (chunked) is 411, since its size is only known after reading it.
 */
function bodyRefusal(req: IncomingMessage): { status: number; message: string } | null {
  const length = req.headers["content-length"];
  if (length !== undefined) {
    return Number(length) > LIMITS.requestBodyBytes
      ? { status: 413, message: `Request body over ${LIMITS.requestBodyBytes} bytes.` }
      : null;
  }
  if (req.headers["transfer-encoding"]) {
    return { status: 411, message: "Send the request body with a Content-Length header." };
  }
  return null;
}

export type App = {
  yoga: YogaServerInstance<InitialContext, GraphQLContext>;
  /** Listens on host:port (port 0 picks a free one) and returns the base URL. */
  start(port?: number, host?: string): Promise<string>;
  stop(): Promise<void>;
};

/**
 * HTTP and WebSocket on one path, sharing one plugin pipeline, one context factory and so one
 * auth check: a request without a valid key gets nothing, GraphiQL included.
 */
export function buildApp(services: Services): App {
  const graphiql = {
    title: "Engram",
    subscriptionsProtocol: "WS" as const,
    headers: JSON.stringify({ Authorization: "Bearer <your Engram API key>" }),
    defaultQuery: "{\n  viewer {\n    role\n    tenant { id name }\n  }\n}\n",
  };
  // Open connections of each key (WebSockets and subscriptions over HTTP), closed on revocation.
  const connectionLimits = { connectionsPerKey: services.env.ENGRAM_WS_MAX_CONNECTIONS_PER_KEY };
  // The caller of each HTTP request, as useKeyFirst found it.
  const keyChecked = new WeakMap<Request, Caller>();
  const sockets = createSocketRegistry(services.pubsub, connectionLimits, (ids) => liveKeyIds(services.db, ids), services.log);
  const cors = corsFor(parseOrigins(services.env.ENGRAM_CORS_ORIGINS));
  // Subscriptions answered as event streams (SSE): stop() closes them instead of waiting.
  const eventStreams = new WeakSet<ServerResponse>();
  const yoga = createYoga<InitialContext, GraphQLContext>({
    schema,
    graphqlEndpoint: GRAPHQL_PATH,
    landingPage: false,
    logging: false,
    maskedErrors: { maskError: (error, message, isDev) => maskError(error, message, isDev, services.log) },
    // GraphiQL is served by useCachedGraphiQL (the bundled page, cached), not by yoga on each request.
    graphiql: false,
    // Same-origin only, unless the operator lists origins (ENGRAM_CORS_ORIGINS).
    cors,
    context: async (initial) => {
      // HTTP requests were checked before their document was read (useKeyFirst); WebSockets at connect.
      const principal = (initial.request && keyChecked.get(initial.request)) || (await services.keys.authenticate(authorizationOf(initial)));
      if (!principal) throw unauthenticated();
      // One budget of model calls for the whole operation, whichever fields spend it, and the reply's deadline on each.
      const limit = Math.min(principal.modelCallsPerRequest ?? Infinity, services.env.ENGRAM_MODEL_CALLS_PER_REQUEST);
      const deps = modelsForRequest(services.deps, { budget: modelCallBudget(limit), deadlineMs: services.env.ENGRAM_REPLY_MODEL_TIMEOUT_MS });
      return { principal, db: forTenant(services.db, principal.tenantId), deps };
    },
    plugins: [
      useEventStreamMarks(eventStreams),
      maxDepthPlugin({ n: LIMITS.queryDepth, ...reportLimitErrors }),
      useQueryCost(LIMITS.queryCost),
      maxAliasesPlugin({ n: LIMITS.aliases, ...reportLimitErrors }),
      useTypedRequestErrors(LIMITS),
      useStreamsOfLiveKeys(sockets, connectionLimits),
      useCachedGraphiQL(GRAPHQL_PATH, graphiql),
      useKeyFirst(services.keys.authenticate, keyChecked, services.log),
      // Seed 000's REST paths (/memory…), generated from the schema, through this same pipeline.
      restApi(schema),
    ],
  });

  // Ready from listening until stop() begins; from then on new requests are refused.
  let ready = false;
  let stopping = false;
  // Requests whose answer is not yet sent: stop() waits for them, up to HTTP_DRAIN_MS.
  const inFlight = new Set<ServerResponse>();
  // MCP (streamable HTTP) on /mcp: its tools call this yoga in process, with the caller's key.
  const serveMcp = mcpHandler({ authenticate: services.keys.authenticate, log: services.log }, yoga);
  // A person's export of any size, streamed (exportUser answers only small ones).
  const serveExport = exportHandler({
    authenticate: services.keys.authenticate,
    keyIsLive: async (apiKeyId) => (await liveKeyIds(services.db, [apiKeyId])).length > 0,
    tenantDb: (id) => forTenant(services.db, id),
    cors: (origin) => corsHeaders(cors, origin),
    log: services.log,
  });

  // Stalled requests are found within a second of their deadline (Node checks every 30 s by default).
  const server: Server = createServer({ connectionsCheckingInterval: 1_000 }, (req: IncomingMessage, res) => {
    const pathname = (req.url ?? "/").split("?")[0];
    if (pathname === "/healthz" || pathname === "/readyz") {
      const parts = {
        ...services,
        query: () => services.db.$queryRawUnsafe("SELECT 1"),
        freeBytes: services.store.kind === "embedded" ? () => freeBytes(services.env.ENGRAM_DATA_DIR) : undefined,
      };
      void checkHealth(parts).then((health) => {
        const up = pathname === "/readyz" ? ready && health.status !== "down" : health.status !== "down";
        const body = pathname === "/readyz" ? { ready: up, ...health } : health;
        res.writeHead(up ? 200 : 503, { "content-type": "application/json", "cache-control": "no-store" });
        res.end(JSON.stringify(body));
      });
      return;
    }
    if (stopping) {
      // A request on a connection kept alive from before: the next one goes to another instance.
      res.writeHead(503, { "content-type": "application/json", connection: "close", "retry-after": "1" });
      res.end(JSON.stringify({ errors: [{ message: "Engram is shutting down.", extensions: { code: "SHUTTING_DOWN" } }] }));
      return;
    }
    inFlight.add(res);
    res.once("close", () => inFlight.delete(res));
    if (serveInspector(req, res)) return;
    const refusal = bodyRefusal(req);
    if (refusal) {
      res.writeHead(refusal.status, { "content-type": "application/json" });
      // On /mcp in JSON-RPC's shape (an invalid request), as the MCP client reads its errors.
      const answer =
        pathname === MCP_PATH
          ? { jsonrpc: "2.0", id: null, error: { code: -32600, message: `BAD_USER_INPUT: ${refusal.message}`, data: { code: "BAD_USER_INPUT" } } }
          : { errors: [{ message: refusal.message, extensions: { code: "BAD_USER_INPUT" } }] };
      res.end(JSON.stringify(answer));
      return;
    }
    if (isExportPath(pathname)) {
      serveExport(req, res).catch((error) => services.log.error("export request failed", { error }));
      return;
    }
    if (req.url?.split("?")[0] === MCP_PATH) {
      serveMcp(req, res).catch((error) => services.log.error("MCP request failed", { error }));
      return;
    }
    void yoga(req, res);
  });
  server.headersTimeout = HTTP_TIMEOUTS.headersMs;
  server.requestTimeout = HTTP_TIMEOUTS.requestMs;
  server.keepAliveTimeout = HTTP_TIMEOUTS.keepAliveMs;

  // Upgrades are handed to the WebSocket server here rather than by its own listeners on the HTTP
  // server, which also re-emitted the HTTP server's errors as its own: a listen that failed (HOST
  // not an address of this machine) was printed with a stack by graphql-ws before start-up's one line.
  const wsServer = new WebSocketServer({ noServer: true, path: GRAPHQL_PATH, maxPayload: LIMITS.requestBodyBytes });
  server.on("upgrade", (request, socket, head) => wsServer.handleUpgrade(request, socket, head, (ws) => wsServer.emit("connection", ws, request)));
  const wsDisposable = useServer<Record<string, unknown>, { request: IncomingMessage; socket: WebSocket }>(
    {
      onConnect: async (ctx) => {
        const principal = await services.keys.authenticate(authorizationOf({ connectionParams: ctx.connectionParams }));
        return Boolean(principal) && sockets.add(principal!.apiKeyId, ctx.extra.socket);
      },
      onSubscribe: async (ctx, _id, payload) => {
        const max = services.env.ENGRAM_WS_MAX_SUBSCRIPTIONS;
        // This subscription is already in ctx.subscriptions (graphql-ws reserves its id first).
        if (Object.keys(ctx.subscriptions).length > max) {
          return [new GraphQLError(`Too many subscriptions on this connection (at most ${max}).`, { extensions: { code: "TOO_MANY_SUBSCRIPTIONS" } })];
        }
        const { schema, execute, subscribe, contextFactory, parse, validate } = yoga.getEnveloped({
          ...ctx,
          req: ctx.extra.request,
          socket: ctx.extra.socket,
          params: payload,
          connectionParams: ctx.connectionParams,
        });
        let document;
        try {
          document = parse(payload.query);
        } catch (error) {
          return [error as GraphQLError];
        }
        const errors = validate(schema, document);
        if (errors.length) return errors;
        try {
          return {
            schema,
            operationName: payload.operationName,
            document,
            variableValues: payload.variables ?? undefined,
            contextValue: await contextFactory(),
            rootValue: { execute, subscribe },
          };
        } catch (error) {
          if (error instanceof GraphQLError) return [error];
          throw error;
        }
      },
      execute: (args) => (args.rootValue as { execute: typeof import("graphql").execute }).execute(args),
      subscribe: (args) => (args.rootValue as { subscribe: typeof import("graphql").subscribe }).subscribe(args),
    },
    wsServer,
  );

  return {
    yoga,
    start(port = services.env.PORT, host = services.env.HOST) {
      return new Promise((resolve, reject) => {
        server.once("error", reject);
        server.listen(port, host, () => {
          ready = true;
          const address = server.address() as AddressInfo;
          resolve(`http://${host.includes(":") ? `[${host}]` : host}:${address.port}`);
        });
      });
    },
    async stop() {
      ready = false;
      stopping = true;
      // No new connections from here; idle kept-alive ones close now.
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeIdleConnections();
      // Requests in flight are answered (each on a connection that then closes), for up to HTTP_DRAIN_MS.
      for (const res of inFlight) if (!res.headersSent) res.setHeader("connection", "close");
      const drainEnds = Date.now() + HTTP_DRAIN_MS;
      const running = () => [...inFlight].filter((res) => !eventStreams.has(res)).length;
      while (running() && Date.now() < drainEnds) await new Promise((resolve) => setTimeout(resolve, 50));
      const cut = running();
      if (cut) services.log.warn(`${cut} request(s) still running after ${HTTP_DRAIN_MS / 1000} s are cut off`);
      await sockets.close();
      await wsDisposable.dispose();
      for (const client of wsServer.clients) client.terminate();
      await new Promise<void>((resolve) => wsServer.close(() => resolve()));
      server.closeAllConnections();
      await closed;
      await yoga.dispose();
    },
  };
}
