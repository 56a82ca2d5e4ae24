import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { ChainName } from "../../src/chains/registry.ts";
import { CHAIN_HEADER } from "../../src/models/metered.ts";

export type ChatRequest = {
  model: string;
  /** The chain that sent the request, from its X-Engram-Chain header (null when it sent none). */
  chain: ChainName | null;
  messages: { role: string; content: string }[];
  /** The request's response_format (structured output), when it had one. */
  responseFormat?: unknown;
};

/** What the scripted model answers: text, or an HTTP error status to simulate an outage. */
export type ScriptedAnswer = string | { status: number; message?: string };

export type ModelServer = {
  url: string;
  requests: ChatRequest[];
  /** Replaces the script; the default answers "{}". */
  respond(script: (request: ChatRequest) => ScriptedAnswer | Promise<ScriptedAnswer>): void;
  /** The inputs of every /v1/embeddings request. */
  embeddingRequests: string[][];
  /** Serves /v1/embeddings with these vectors (or an error status); unset, it answers 404. */
  embed(script: ((input: string[]) => number[][] | { status: number }) | null): void;
  /** What /v1/embeddings answers say of usage: the texts' length (the default), nothing, or 0 (OpenAI's carry it; some compatible servers' do not, or say 0). */
  reportEmbeddingUsage(mode: "length" | "none" | "zero"): void;
  stop(): Promise<void>;
};

/**
 * A small OpenAI-compatible server on loopback, so tests run the real @langchain/openai client.
 * Every request is recorded; answers come from a script.
 */
export async function startModelServer(port = 0): Promise<ModelServer> {
  const requests: ChatRequest[] = [];
  let script: (request: ChatRequest) => ScriptedAnswer | Promise<ScriptedAnswer> = () => "{}";
  const embeddingRequests: string[][] = [];
  let embedScript: ((input: string[]) => number[][] | { status: number }) | null = null;
  let embeddingUsage: "length" | "none" | "zero" = "length";
  const server: Server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
    if (req.url?.endsWith("/embeddings") && embedScript) {
      const input: string[] = Array.isArray(body.input) ? body.input : [body.input];
      embeddingRequests.push(input);
      const vectors = embedScript(input);
      if (!Array.isArray(vectors)) {
        res.writeHead(vectors.status, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: "scripted failure", type: "server_error" } }));
        return;
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          object: "list",
          model: body.model,
          data: vectors.map((embedding, index) => ({ object: "embedding", index, embedding })),
          ...(embeddingUsage !== "none" && {
            usage: Object.fromEntries(["prompt_tokens", "total_tokens"].map((k) => [k, embeddingUsage === "zero" ? 0 : input.join(" ").length])),
          }),
        }),
      );
      return;
    }
    if (!req.url?.endsWith("/chat/completions")) {
      res.writeHead(404).end();
      return;
    }
    const chain = req.headers[CHAIN_HEADER.toLowerCase()];
    const request: ChatRequest = {
      model: body.model,
      chain: typeof chain === "string" ? (chain as ChainName) : null,
      messages: (body.messages ?? []).map((m: { role: string; content: unknown }) => ({
        role: m.role,
        content: typeof m.content === "string" ? m.content : JSON.stringify(m.content),
      })),
      ...(body.response_format ? { responseFormat: body.response_format } : {}),
    };
    requests.push(request);
    const answer = await script(request);
    if (typeof answer !== "string") {
      res.writeHead(answer.status, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: answer.message ?? "scripted failure", type: "server_error" } }));
      return;
    }
    const promptTokens = request.messages.reduce((n, m) => n + Math.ceil(m.content.length / 4), 0);
    const completionTokens = Math.ceil(answer.length / 4);
    res.writeHead(200, { "content-type": "application/json" });
    res.end(
      JSON.stringify({
        id: `chatcmpl-${requests.length}`,
        object: "chat.completion",
        created: Math.floor(Date.now() / 1000),
        model: request.model,
        choices: [{ index: 0, message: { role: "assistant", content: answer }, finish_reason: "stop" }],
        usage: {
          prompt_tokens: promptTokens,
          completion_tokens: completionTokens,
          total_tokens: promptTokens + completionTokens,
        },
      }),
    );
  });
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
  const { port: actual } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${actual}/v1`,
    requests,
    respond(next) {
      script = next;
    },
    embeddingRequests,
    reportEmbeddingUsage(mode) {
      embeddingUsage = mode;
    },
    embed(next) {
      embedScript = next;
    },
    async stop() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
