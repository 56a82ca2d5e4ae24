import { McpServer, ResourceTemplate } from "@modelcontextprotocol/sdk/server/mcp.js";
import { ErrorCode, McpError, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { EngramError, memoryText, type EngramClient } from "../client/index.ts";
import { factTextSchema, textProblem } from "../limits.ts";

// Every tool is a call on Engram's GraphQL API through the typed client, with the caller's key:
// roles, limits, validation and errors are the API's own, and no resolver logic lives here.

const user = z.string().min(1).describe("Your id for the end user (the one you use in recordTurn).");
const scope = z.enum(["INSTITUTIONAL", "ENTITY", "PROJECT", "TEAM"]);

const text = (value: string): CallToolResult => ({ content: [{ type: "text", text: value }] });
const json = (value: unknown): CallToolResult => ({
  content: [{ type: "text", text: JSON.stringify(value, null, 2) }],
  structuredContent: value as Record<string, unknown>,
});

/** Expected failures become tool errors the agent can read ("FORBIDDEN: …"); others propagate. */
async function tool(work: () => Promise<CallToolResult>): Promise<CallToolResult> {
  try {
    return await work();
  } catch (error) {
    if (error instanceof EngramError) return { isError: true, content: [{ type: "text", text: `${error.code}: ${error.message}` }] };
    throw error;
  }
}

// MCP's code for a resource that does not exist (the SDK's ErrorCode has no name for it).
const RESOURCE_NOT_FOUND = -32002;

/**
 * A resource read's expected failure as a JSON-RPC error: NOT_FOUND is MCP's "resource not
 * found" (-32002), bad input is InvalidParams, and the message starts with Engram's code as a
 * tool error's does. McpError would prefix its message with "MCP error <code>:"; this one does not.
 */
class ResourceError extends McpError {
  constructor(error: EngramError) {
    const code = error.code === "NOT_FOUND" ? RESOURCE_NOT_FOUND : error.code === "BAD_USER_INPUT" ? ErrorCode.InvalidParams : ErrorCode.InternalError;
    super(code, "", { code: error.code });
    this.message = `${error.code}: ${error.message}`;
  }
}

/** Expected failures of a resource read become typed JSON-RPC errors; others propagate (masked as internal errors). */
async function resource<T>(work: () => Promise<T>): Promise<T> {
  try {
    return await work();
  } catch (error) {
    if (error instanceof EngramError) throw new ResourceError(error);
    throw error;
  }
}

/** A URI template variable, percent-decoded; malformed encoding is the caller's mistake. */
function decoded(value: string | string[], what: string): string {
  try {
    return decodeURIComponent(String(value));
  } catch {
    throw new EngramError("BAD_USER_INPUT", `The ${what} in the URI is not valid percent-encoding.`);
  }
}

/** Engram as an MCP server: memory tools and resources for one API key's tenant. */
export function createMcpServer(client: EngramClient, version = "0.1.0"): McpServer {
  const server = new McpServer({ name: "engram", version });

  server.registerTool(
    "remember",
    {
      description: "Store one durable fact the user explicitly stated about themselves (one self-contained sentence).",
      inputSchema: {
        user,
        // Checked as the API checks it, so the agent is told the limits before it calls.
        fact: factTextSchema
          .superRefine((value, ctx) => {
            const problem = textProblem(value);
            if (problem) ctx.addIssue({ code: "custom", message: `The fact ${problem}.` });
          })
          .describe('e.g. "Ana is vegetarian."'),
        core: z.boolean().optional().describe("True for who they are or a lasting preference."),
      },
    },
    (args) =>
      tool(async () => {
        // One call: the end user is created with the fact, so a refused or failed write leaves none.
        const fact = await client.addFact({ endUserExternalId: args.user, text: args.fact, core: args.core });
        return json({ factId: fact.id, text: fact.text, core: fact.core });
      }),
  );

  server.registerTool(
    "recall",
    {
      description: "Search the user's earlier conversations for what they said before (past orders, 'last time', 'my usual').",
      inputSchema: { user, query: z.string().min(1), k: z.number().int().min(1).max(20).optional().describe("How many snippets, default 5.") },
    },
    (args) =>
      tool(async () => {
        const { candidates } = await client.recall({ endUserExternalId: args.user, text: args.query, k: args.k ?? 5 });
        return json({ snippets: candidates.map((c) => ({ text: c.text, conversationId: c.conversationId, occurredAt: c.occurredAt, score: c.fusedScore })) });
      }),
  );

  server.registerTool(
    "forget",
    {
      description:
        "Forget one fact (factId), or with everything: true all Engram holds about the user (facts, recall, summaries, " +
        "entries and events about them, messages); answers what was deleted.",
      inputSchema: {
        user,
        factId: z.string().optional().describe("A fact id from search_memory (with user) or the facts resource (get_context shows facts without their ids)."),
        everything: z.boolean().optional(),
      },
    },
    (args) =>
      tool(async () => {
        if (Boolean(args.factId) === Boolean(args.everything)) {
          throw new EngramError("BAD_USER_INPUT", "Give either factId or everything: true.");
        }
        const endUser = { externalId: args.user };
        if (args.everything) return json({ forgotten: await client.forgetUser(endUser) });
        const facts = await client.facts(endUser);
        if (!facts.some((fact) => fact.id === args.factId)) throw new EngramError("NOT_FOUND", `The user has no fact ${args.factId}.`);
        const change = await client.deleteFact(args.factId!);
        return json({ forgotten: { factId: change.factId } });
      }),
  );

  server.registerTool(
    "get_context",
    {
      description:
        "Before answering: what Engram remembers for this conversation (facts, summary, messages, recall, entries). " +
        "With user and agent, a new conversation gets what it knows of the user.",
      inputSchema: {
        conversation: z.string().min(1).describe("Your id for the conversation."),
        message: z.string().min(1).describe("The user's message you are about to answer."),
        user: user.optional(),
        agent: z.string().min(1).optional().describe("Your id for the agent (the one you use in recordTurn); with user."),
      },
    },
    (args) =>
      tool(async () => {
        if (Boolean(args.user) !== Boolean(args.agent)) throw new EngramError("BAD_USER_INPUT", "Give user and agent together, or neither.");
        // By the three ids, a conversation with no turns yet is asked about too; by the
        // conversation's id alone, it must have been recorded.
        let asked: Parameters<EngramClient["context"]>[0];
        if (args.user && args.agent) {
          asked = { agentExternalId: args.agent, endUserExternalId: args.user, conversationExternalId: args.conversation, message: args.message };
        } else {
          const conversation = await client.conversation(args.conversation, { lastMessages: 1 });
          if (!conversation) return text("Nothing remembered yet: this conversation has no recorded turns (give user and agent for what Engram knows about the user).");
          asked = { conversationId: conversation.id, message: args.message };
        }
        const context = await client.context(asked);
        return text(memoryText(context.blocks) || "Nothing remembered yet.");
      }),
  );

  server.registerTool(
    "search_memory",
    {
      description: "Search curated memory entries (by text, scope, tags) and, with user, that user's facts.",
      inputSchema: {
        query: z.string().min(1),
        user: user.optional(),
        scope: scope.optional(),
        scopeRef: z.string().optional().describe("Entity, project or team id, by scope."),
        tags: z.array(z.string()).optional(),
      },
    },
    (args) =>
      tool(async () => {
        const { entries } = await client.searchEntries({ search: args.query, scope: args.scope, scopeRef: args.scopeRef, tags: args.tags, first: 10 });
        const words = args.query.toLowerCase().match(/\p{L}[\p{L}\p{N}]{2,}/gu) ?? [];
        const facts = args.user ? await client.facts({ externalId: args.user }) : [];
        return json({
          entries: entries.map((e) => ({ id: e.id, title: e.title, summary: e.summary, tags: e.tags, importance: e.importance })),
          facts: facts.filter((f) => words.some((w) => f.text.toLowerCase().includes(w))).map((f) => ({ id: f.id, text: f.text, core: f.core })),
        });
      }),
  );

  server.registerTool(
    "append_event",
    {
      description: "Log something that happened (a call summary, a decision…) to the event log; sourceRef makes retries safe.",
      inputSchema: {
        scope,
        scopeRef: z.string().min(1),
        kind: z.string().min(1).describe("call_summary, decision, campaign_change…"),
        body: z.string().min(1).describe("Markdown."),
        source: z.string().min(1).optional().describe('Who writes it, default "mcp".'),
        sourceRef: z.string().optional(),
      },
    },
    (args) =>
      tool(async () => {
        const event = await client.appendEvent({ ...args, source: args.source ?? "mcp" });
        return json({ eventId: event.id, sourceRef: event.sourceRef, occurredAt: event.occurredAt });
      }),
  );

  server.registerResource(
    "user-facts",
    new ResourceTemplate("engram://users/{user}/facts", { list: undefined }),
    { description: "What Engram knows about an end user (your id): their facts, core first.", mimeType: "application/json" },
    (uri, { user }) =>
      resource(async () => {
        const facts = await client.facts({ externalId: decoded(user, "user") });
        const body = facts.map((f) => ({ id: f.id, text: f.text, core: f.core, confirmedAt: f.confirmedAt }));
        return { contents: [{ uri: uri.href, mimeType: "application/json", text: JSON.stringify(body, null, 2) }] };
      }),
  );

  server.registerResource(
    "conversation-summary",
    new ResourceTemplate("engram://conversations/{conversation}/summary", { list: undefined }),
    { description: "The rolling summary of a conversation (your id).", mimeType: "text/plain" },
    (uri, { conversation }) =>
      resource(async () => {
        const id = decoded(conversation, "conversation");
        const found = await client.conversation(id, { lastMessages: 1 });
        if (!found) throw new EngramError("NOT_FOUND", `Engram knows no conversation "${id}".`);
        return { contents: [{ uri: uri.href, mimeType: "text/plain", text: found.summary ?? "" }] };
      }),
  );

  return server;
}
