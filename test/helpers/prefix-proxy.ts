import { createServer, request } from "node:http";
import { connect, type AddressInfo } from "node:net";

/**
 * A loopback reverse proxy that serves `target` under a path prefix it strips, as an operator's
 * nginx with `location /engram/ { proxy_pass http://engram/; }` does: plain requests streamed
 * through, WebSocket upgrades piped. Anything outside the prefix is 404.
 */
export async function startPrefixProxy(target: string, prefix: string) {
  const upstream = new URL(target);
  const strip = (url = "/") => (url.startsWith(`${prefix}/`) ? url.slice(prefix.length) : null);
  const server = createServer((req, res) => {
    const path = strip(req.url);
    if (!path) return void res.writeHead(404).end();
    const forwarded = request(new URL(path, upstream), { method: req.method, headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    });
    forwarded.on("error", () => res.destroy());
    req.pipe(forwarded);
  });
  server.on("upgrade", (req, socket, head) => {
    const path = strip(req.url);
    if (!path) return void socket.destroy();
    const to = connect(Number(upstream.port), upstream.hostname, () => {
      const lines = [`${req.method} ${path} HTTP/1.1`];
      for (let i = 0; i < req.rawHeaders.length; i += 2) lines.push(`${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}`);
      to.write(`${lines.join("\r\n")}\r\n\r\n`);
      to.write(head);
      to.pipe(socket).pipe(to);
    });
    to.on("error", () => socket.destroy());
    socket.on("error", () => to.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}${prefix}`,
    async stop() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
