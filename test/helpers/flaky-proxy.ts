import { createServer, request, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * What the proxy does to the next request: answer 503 itself, forward it and then cut the
 * connection before the answer (the write happened, the caller never hears), hold it forever, or
 * send the answer's status and headers and then hold its body forever.
 */
export type Fault = "503" | "drop-answer" | "hang" | "stall-body";

/** A loopback HTTP proxy in front of a real Engram that injects the faults queued with fail(). */
export async function startFlakyProxy(target: string) {
  const faults: Fault[] = [];
  const seen: { method: string; url: string; fault?: Fault }[] = [];
  const held: ServerResponse[] = [];
  const forward = (req: IncomingMessage, body: Buffer, onAnswer: (status: number, headers: IncomingMessage["headers"], answer: Buffer) => void) => {
    const upstream = request(new URL(req.url ?? "/", target), { method: req.method, headers: req.headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk) => chunks.push(chunk));
      res.on("end", () => onAnswer(res.statusCode ?? 502, res.headers, Buffer.concat(chunks)));
    });
    upstream.end(body);
  };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk) => chunks.push(chunk));
    req.on("end", () => {
      const fault = faults.shift();
      seen.push({ method: req.method ?? "", url: req.url ?? "", fault });
      if (fault === "503") {
        res.writeHead(503, { "content-type": "text/plain" }).end("upstream busy");
      } else if (fault === "hang") {
        held.push(res);
      } else if (fault === "stall-body") {
        res.writeHead(200, { "content-type": "application/json" });
        res.write('{"data":');
        held.push(res);
      } else {
        forward(req, Buffer.concat(chunks), (status, headers, answer) => {
          if (fault === "drop-answer") res.socket?.destroy();
          else res.writeHead(status, headers).end(answer);
        });
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    /** Queues faults for the next requests, in order. */
    fail(...next: Fault[]) {
      faults.push(...next);
    },
    seen,
    async stop() {
      for (const res of held) res.socket?.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
