import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { EngramClient, EngramError as ClientError } from "../client/index.ts";
import type { Env } from "../env.ts";
import { EngramError, type ErrorCode } from "../errors.ts";
import { createMcpServer } from "./server.ts";

/**
 * `engram mcp`: an MCP server on stdin/stdout for desktop agents, talking to a running Engram
 * at ENGRAM_URL with ENGRAM_API_KEY. The key is checked first, so a wrong one fails at once.
 */
export async function serveMcpOverStdio(env: Env): Promise<void> {
  if (!env.ENGRAM_API_KEY) {
    throw new EngramError("BAD_USER_INPUT", "Set ENGRAM_API_KEY to an Engram API key (and ENGRAM_URL if Engram is not at http://127.0.0.1:4000).");
  }
  const client = new EngramClient({ url: env.ENGRAM_URL, apiKey: env.ENGRAM_API_KEY });
  const viewer = await client.viewer().catch((error: unknown) => {
    if (error instanceof ClientError) throw new EngramError(error.code as ErrorCode, `engram mcp: ${error.message}`);
    throw error;
  });
  const server = createMcpServer(client);
  await server.connect(new StdioServerTransport());
  process.stderr.write(`engram mcp: serving tenant ${viewer.tenant.name} (${viewer.role.toLowerCase()} key) from ${env.ENGRAM_URL}\n`);
}
