import { createReadStream, existsSync, readFileSync, statSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import path from "node:path";
import { fromRoot } from "./paths.ts";

export const INSPECTOR_PATH = "/inspector";

/** The Vite build of web/ (`npm run build:web`). */
export const INSPECTOR_DIST = fromRoot("web", "dist") + path.sep;

const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".json": "application/json",
  ".map": "application/json",
  ".woff2": "font/woff2",
  ".txt": "text/plain; charset=utf-8",
};

// A Host header is only trusted as a plain host[:port]; anything else stays out of the CSP.
const PLAIN_HOST = /^(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?$/;

function securityHeaders(req: IncomingMessage) {
  const host = PLAIN_HOST.test(req.headers.host ?? "") ? req.headers.host! : null;
  return {
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    // Everything is served from here; the page talks only to this server's GraphQL endpoint.
    "content-security-policy":
      `default-src 'self'; connect-src 'self'${host ? ` ws://${host} wss://${host}` : ""}; img-src 'self' data:; ` +
      "style-src 'self'; script-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
  };
}

function sendFile(req: IncomingMessage, res: ServerResponse, file: string, cache: string, body?: Buffer) {
  const type = CONTENT_TYPES[path.extname(file)] ?? "application/octet-stream";
  res.writeHead(200, {
    "content-type": type,
    "content-length": body?.length ?? statSync(file).size,
    "cache-control": cache,
    ...securityHeaders(req),
  });
  if (req.method === "HEAD") res.end();
  else if (body) res.end(body);
  else createReadStream(file).pipe(res);
}

/**
 * The page for a path `relative` below the inspector's root. Its assets are linked relatively
 * (`./assets/…`, so that a proxy may serve Engram under a prefix it strips), which from a deeper
 * path such as `users/<id>` must climb back to the root first.
 */
function pageAt(index: string, relative: string): Buffer {
  const depth = relative.split("/").length - 1;
  const html = readFileSync(index, "utf8");
  return Buffer.from(depth === 0 ? html : html.replaceAll('="./assets/', `="${"../".repeat(depth)}assets/`));
}

/**
 * Serves the inspector's static build under /inspector: hashed assets as they are, any other
 * path the page itself (it routes on the client). Nothing in it names /inspector or the server's
 * root, so a reverse proxy may serve it under a path prefix. Returns false for requests it does
 * not own.
 */
export function serveInspector(req: IncomingMessage, res: ServerResponse, dist = INSPECTOR_DIST): boolean {
  const pathname = (req.url ?? "/").split("?")[0];
  if (pathname !== INSPECTOR_PATH && !pathname.startsWith(`${INSPECTOR_PATH}/`)) return false;
  if (req.method !== "GET" && req.method !== "HEAD") {
    res.writeHead(405, { allow: "GET, HEAD" }).end();
    return true;
  }
  if (pathname === INSPECTOR_PATH) {
    // Relative, so that it also holds under a proxy's path prefix.
    res.writeHead(308, { location: `${INSPECTOR_PATH.slice(1)}/` }).end();
    return true;
  }
  const index = path.join(dist, "index.html");
  if (!existsSync(index)) {
    res.writeHead(503, { "content-type": "text/plain; charset=utf-8" });
    res.end("The inspector is not built: run `npm run build:web` (or `npx vite build --config web/vite.config.ts`).\n");
    return true;
  }
  let relative: string;
  try {
    relative = decodeURIComponent(pathname.slice(INSPECTOR_PATH.length + 1));
  } catch {
    res.writeHead(400).end();
    return true;
  }
  const file = path.resolve(dist, relative);
  const inside = file.startsWith(dist) && file !== path.resolve(dist);
  if (inside && existsSync(file) && statSync(file).isFile()) {
    const hashed = relative.startsWith("assets/");
    sendFile(req, res, file, hashed ? "public, max-age=31536000, immutable" : "no-cache");
    return true;
  }
  // A missing asset is a 404, not the page: a stale tab must not run HTML as a script.
  if (relative.startsWith("assets/") || path.extname(relative)) {
    res.writeHead(404, { "content-type": "text/plain; charset=utf-8" }).end("Not found\n");
    return true;
  }
  sendFile(req, res, index, "no-cache", pageAt(index, relative));
  return true;
}
