/**
 * A GraphQL subscription over Server-Sent Events (the "distinct connections" mode yoga serves
 * when a POST asks for `text/event-stream`). `next()` waits for the next `next` event's payload.
 */
export async function sseSubscribe<T = any>(
  httpUrl: string,
  key: string | null,
  query: string,
  variables?: Record<string, unknown>,
) {
  const abort = new AbortController();
  const response = await fetch(`${httpUrl}/graphql`, {
    method: "POST",
    headers: {
      accept: "text/event-stream",
      "content-type": "application/json",
      ...(key ? { authorization: `Bearer ${key}` } : {}),
    },
    body: JSON.stringify({ query, variables }),
    signal: abort.signal,
  });
  const received: { data?: T | null; errors?: { message: string; extensions?: Record<string, unknown> }[] }[] = [];
  let ended = false;
  const waiters: (() => void)[] = [];
  const wake = () => waiters.splice(0).forEach((w) => w());

  void (async () => {
    const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let boundary: number;
        while ((boundary = buffer.indexOf("\n\n")) >= 0) {
          const message = buffer.slice(0, boundary);
          buffer = buffer.slice(boundary + 2);
          const lines = message.split("\n");
          const event = lines.find((l) => l.startsWith("event:"))?.slice(6).trim() ?? "message";
          const data = lines.filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
          if (event === "complete") ended = true;
          else if (data) received.push(JSON.parse(data));
          wake();
        }
      }
    } catch {
      // aborted by close()
    } finally {
      ended = true;
      wake();
    }
  })();

  return {
    status: response.status,
    contentType: response.headers.get("content-type") ?? "",
    received,
    get ended() {
      return ended;
    },
    /** Waits for the count-th result, or for the stream to end. */
    async next(count = 1, timeoutMs = 10_000) {
      const deadline = Date.now() + timeoutMs;
      while (received.length < count && !ended) {
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${count} SSE results`);
        await new Promise<void>((resolve) => {
          waiters.push(resolve);
          setTimeout(resolve, 100);
        });
      }
      return received[count - 1];
    },
    close() {
      abort.abort();
    },
  };
}
