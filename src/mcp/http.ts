import type { IncomingMessage, ServerResponse } from "node:http";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { EngramClient } from "../client/index.ts";
import type { Principal } from "../governance/keys.ts";
import type { Logger } from "../log.ts";
import { createMcpServer } from "./server.ts";

export const MCP_PATH = "/mcp";

type Fetcher = { fetch(input: string | URL | Request, init?: RequestInit): Response | Promise<Response> };

/**
 * MCP over streamable HTTP, stateless: each request gets its own server whose tools call the
 * GraphQL API in process (yoga.fetch) with the caller's own key, so roles are the API's.
 */
export function mcpHandler(
  deps: { authenticate(authorization: string | null): Promise<Principal | null>; log: Logger },
  yoga: Fetcher,
) {
  return async (req: IncomingMessage, res: ServerResponse) => {
    const authorization = req.headers.authorization ?? null;
    let caller: Principal | null;
    try {
      caller = await deps.authenticate(authorization);
    } catch (error) {
      deps.log.error("MCP key lookup failed", { error });
      internalError(res);
      return;
    }
    if (!caller) {
      res.writeHead(401, { "content-type": "application/json", "www-authenticate": 'Bearer realm="engram"' });
      res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32001, message: "A valid API key is required: send `Authorization: Bearer <key>`." } }));
      return;
    }
    // Stateless: no stream for the server to push on (a GET would stay open, outside the per-key
    // connection limit and revocation), nothing to delete. Only POST, one message each.
    if (req.method !== "POST") {
      refuse(res, 405, -32000, "Method not allowed: this MCP server is stateless and takes POST only.", { allow: "POST" });
      return;
    }
    let body: unknown;
    try {
      body = JSON.parse(await readBody(req));
    } catch {
      refuse(res, 400, -32700, "Parse error: the body is not JSON.");
      return;
    }
    // A batch would run up to 100 tool calls at once, each with its own per-request limits.
    if (Array.isArray(body)) {
      refuse(res, 400, -32600, "Batches are not accepted: send one JSON-RPC message per request.");
      return;
    }
    const client = new EngramClient({
      url: "http://engram.internal",
      apiKey: authorization!.trim().replace(/^Bearer\s+/i, ""),
      retries: 0,
      fetch: (input, init) => Promise.resolve(yoga.fetch(input as string, init)),
    });
    const server = createMcpServer(client);
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on("close", () => {
      void transport.close();
      void server.close();
    });
    try {
      await server.connect(transport);
      await transport.handleRequest(req, res, body);
    } catch (error) {
      deps.log.error("MCP request failed", { error });
      internalError(res);
    }
  };
}

/** An unexpected failure (the store down…): typed as the API's, its cause only in the log. */
function internalError(res: ServerResponse) {
  const message = "INTERNAL_SERVER_ERROR: Unexpected error; the server's log has it.";
  if (res.headersSent) return void res.end();
  refuse(res, 500, -32603, message);
}

function refuse(res: ServerResponse, status: number, code: number, message: string, headers: Record<string, string> = {}) {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code, message } }));
}

/** The request's body as text (its size was checked before it was routed here: bodyRefusal, app.ts). */
async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}
