import { createServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * A model "provider" on loopback that answers each request with `behave` once its body has
 * arrived, for tests of providers that stall, trickle or answer late. It counts the requests it
 * got and the connections still open (a call torn down closes its connection).
 */
export async function startLoopbackProvider(behave: (res: ServerResponse, body: string) => void) {
  let hits = 0;
  let open = 0;
  const server = createServer((req, res) => {
    hits++;
    open++;
    res.on("close", () => open--);
    let body = "";
    req.on("data", (chunk) => (body += chunk));
    req.on("end", () => behave(res, body));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    host: `127.0.0.1:${port}`,
    url: `http://127.0.0.1:${port}/v1`,
    hits: () => hits,
    open: () => open,
    stop: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}

export type LoopbackProvider = Awaited<ReturnType<typeof startLoopbackProvider>>;

/** Answers 200 and the start of a JSON body, and never the rest: what the OpenAI client's own timeout does not cover. */
export function stallAfterHeaders(res: ServerResponse) {
  res.writeHead(200, { "content-type": "application/json" });
  res.write('{"id":"stalled","object":"chat.completion","data":[');
}

/** Settles `work`: its value or its error, and how long it took. */
export async function timed<T>(work: Promise<T>): Promise<{ value: T | null; error: unknown; ms: number }> {
  const started = Date.now();
  const [value, error] = await work.then(
    (v) => [v, null] as const,
    (e: unknown) => [null, e] as const,
  );
  return { value, error, ms: Date.now() - started };
}
