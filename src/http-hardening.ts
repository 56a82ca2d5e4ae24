import { createHash } from "node:crypto";
import { gzipSync } from "node:zlib";
import { getCORSHeadersByRequestAndOptions } from "@whatwg-node/server";
import type { GraphiQLOptions, Plugin } from "graphql-yoga";

/**
 * Slow clients cannot hold a connection open: headers within 10 s, the whole request within 30 s.
 * An idle keep-alive connection is kept 65 s, as long as browsers and proxies keep theirs (up to
 * 60 s). With Node's 5 s default, a client reusing a socket just as the server closed it got
 * "other side closed" on a request it never sent (seen once in the README test). undici (fetch)
 * keeps a socket for the server's announced timeout less a second, so that race is not gone for
 * it, but it now takes a client idle for 64 s rather than 4.
 */
export const HTTP_TIMEOUTS = { headersMs: 10_000, requestMs: 30_000, keepAliveMs: 65_000 } as const;

/**
 * CORS: same-origin only (no CORS headers at all) unless the operator lists origins in
 * ENGRAM_CORS_ORIGINS; a listed origin gets exactly itself back, with credentials.
 */
export function corsFor(origins: string[]) {
  const allowed = new Set(origins);
  return (request: Pick<Request, "headers">) => {
    const origin = request.headers.get("origin");
    if (!origin || !allowed.has(origin)) return false as const;
    return {
      origin: [origin],
      credentials: true,
      // PUT and DELETE for the REST paths (/memory/:id).
      methods: ["GET", "POST", "PUT", "DELETE", "OPTIONS"],
      allowedHeaders: ["authorization", "content-type", "accept"],
      // The streamed export's file name.
      exposedHeaders: ["content-disposition"],
    };
  };
}

/**
 * The headers yoga's CORS plugin sends for corsFor's answer to a request from `origin`, for a path
 * served beside yoga (the streamed export): the same function makes them (none for an origin not
 * listed). Each answer also says Vary: Origin (yoga leaves it out for one listed origin), so no
 * cache hands one origin's answer to another.
 */
export function corsHeaders(cors: ReturnType<typeof corsFor>, origin: string | undefined): Record<string, string> {
  const request = { headers: new Headers(origin ? { origin } : {}) };
  return { ...getCORSHeadersByRequestAndOptions(request as Request, cors(request)), vary: "Origin" };
}

export function parseOrigins(value: string | undefined): string[] {
  return (value ?? "")
    .split(",")
    .map((origin) => origin.trim().replace(/\/+$/, ""))
    .filter(Boolean);
}

/**
 * The bundled GraphiQL (the default page loads its code from a CDN, which offline machines cannot
 * reach) holds every script it needs (several MB), and a browser asks for it without a key:
 * it is rendered once, served gzipped when the browser takes it, and cached with an ETag, so a
 * repeat visit costs a 304. Its package is loaded on the first visit, not at start: as a module
 * it is ~28 MB of heap (its source, and the page inside it as a string) in a server no one may
 * ever open it in.
 */
export function useCachedGraphiQL(endpoint: string, options: GraphiQLOptions): Plugin {
  let page: Promise<{ html: Buffer; gzip: Buffer; etag: string }> | undefined;
  const render = async () => {
    const { renderGraphiQL } = await import("@graphql-yoga/render-graphiql");
    const html = Buffer.from(renderGraphiQL({ ...options, endpoint } as Parameters<typeof renderGraphiQL>[0]));
    return { html, gzip: gzipSync(html), etag: `"${createHash("sha256").update(html).digest("base64url").slice(0, 27)}"` };
  };
  const serve = async ({ request, endResponse, fetchAPI }: Parameters<NonNullable<Plugin["onRequest"]>>[0]) => {
    page ??= render().catch((error) => {
      page = undefined;
      throw error;
    });
    const { html, gzip: gzipped, etag } = await page;
    const headers: Record<string, string> = {
      "content-type": "text/html; charset=utf-8",
      "cache-control": "public, max-age=86400",
      etag,
      vary: "accept-encoding",
    };
    if (request.headers.get("if-none-match") === etag) {
      endResponse(new fetchAPI.Response(null, { status: 304, headers }));
      return;
    }
    const gzip = /\bgzip\b/.test(request.headers.get("accept-encoding") ?? "");
    if (gzip) headers["content-encoding"] = "gzip";
    endResponse(new fetchAPI.Response(new Uint8Array(gzip ? gzipped : html), { status: 200, headers }));
  };
  return {
    // Synchronous for every other request: only a browser's GET of the endpoint waits on the page.
    onRequest(payload) {
      const { request, url } = payload;
      if (request.method !== "GET" || url.pathname !== endpoint || url.search) return;
      if (!request.headers.get("accept")?.includes("text/html")) return;
      return serve(payload);
    },
  };
}
