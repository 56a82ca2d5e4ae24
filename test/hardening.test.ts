import { request } from "node:http";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { IMPORT } from "./helpers/recall.ts";
import { until } from "./helpers/until.ts";

const VIEWER = JSON.stringify({ query: "{ viewer { role } }" });

describe("HTTP hardening", () => {
  let engram: TestEngram;
  let url: string;
  beforeAll(async () => {
    engram = await startTestEngram({ env: { ENGRAM_EMBEDDINGS: "offline", ENGRAM_CORS_ORIGINS: "https://app.example" } });
    url = await engram.listen();
  });
  afterAll(() => engram?.stop());

  const post = (origin: string) =>
    engram.app.yoga.fetch("http://engram.test/graphql", {
      method: "POST",
      headers: { origin, "content-type": "application/json", authorization: `Bearer ${engram.tenant.reader}` },
      body: VIEWER,
    });

  it("answers CORS only for the listed origins, never reflecting others", async () => {
    const evil = await post("https://evil.example");
    expect(evil.headers.get("access-control-allow-origin")).toBeNull();
    expect(evil.headers.get("access-control-allow-credentials")).toBeNull();
    const listed = await post("https://app.example");
    expect(listed.headers.get("access-control-allow-origin")).toBe("https://app.example");
    expect(listed.headers.get("access-control-allow-credentials")).toBe("true");
    const preflight = await engram.app.yoga.fetch("http://engram.test/graphql", {
      method: "OPTIONS",
      headers: { origin: "https://evil.example", "access-control-request-method": "POST" },
    });
    expect(preflight.headers.get("access-control-allow-origin")).toBeNull();
  });

  it("lets a listed origin's preflight through for every method the REST paths use", async () => {
    for (const method of ["GET", "POST", "PUT", "DELETE"]) {
      const preflight = await engram.app.yoga.fetch("http://engram.test/memory/some-entry", {
        method: "OPTIONS",
        headers: { origin: "https://app.example", "access-control-request-method": method, "access-control-request-headers": "authorization,content-type" },
      });
      expect(preflight.status, method).toBeLessThan(300);
      expect(preflight.headers.get("access-control-allow-origin")).toBe("https://app.example");
      expect(preflight.headers.get("access-control-allow-methods")?.split(/,\s*/)).toContain(method);
    }
  });

  it("answers CORS on the streamed export as yoga does on /graphql: its preflight, the download and its errors", async () => {
    const { data } = await engram.gql(IMPORT, { input: { agentExternalId: "shop", endUserExternalId: "cors-user", conversationExternalId: "cors-1", messages: [{ role: "USER", content: "Hello." }] } });
    const exportUrl = `${url}/export/users/${data.importConversation.endUser.id}`;
    const cors = (response: Response) => Object.fromEntries([...response.headers].filter(([name]) => name.startsWith("access-control-")));
    const preflight = { origin: "https://app.example", "access-control-request-method": "GET", "access-control-request-headers": "authorization" };

    // The preflight carries no key: 204 with yoga's headers, not 401.
    const asked = await fetch(exportUrl, { method: "OPTIONS", headers: preflight });
    expect(asked.status).toBe(204);
    const yogas = await fetch(`${url}/graphql`, { method: "OPTIONS", headers: preflight });
    expect(cors(asked)).toEqual(cors(yogas));
    expect(cors(asked)).toMatchObject({ "access-control-allow-origin": "https://app.example", "access-control-allow-credentials": "true" });
    expect(asked.headers.get("access-control-allow-methods")?.split(/,\s*/)).toContain("GET");
    expect(asked.headers.get("access-control-allow-headers")?.split(/,\s*/)).toContain("authorization");

    // The download, its file name readable by the page; a refused key's answer readable too.
    const download = await fetch(exportUrl, { headers: { origin: "https://app.example", authorization: `Bearer ${engram.tenant.admin}` } });
    expect(download.status).toBe(200);
    expect(cors(download)).toEqual(cors(asked));
    expect(download.headers.get("access-control-expose-headers")).toBe("content-disposition");
    expect(download.headers.get("vary")).toBe("Origin");
    expect((await download.json()).endUser.externalId).toBe("cors-user");
    const refused = await fetch(exportUrl, { headers: { origin: "https://app.example", authorization: `Bearer ${engram.tenant.reader}` } });
    expect(refused.status).toBe(403);
    expect(refused.headers.get("access-control-allow-origin")).toBe("https://app.example");

    // An origin not listed gets no CORS headers, on the preflight or the download.
    const evil = await fetch(exportUrl, { method: "OPTIONS", headers: { ...preflight, origin: "https://evil.example" } });
    expect(evil.status).toBe(204);
    expect(cors(evil)).toEqual({});
    const taken = await fetch(exportUrl, { headers: { origin: "https://evil.example", authorization: `Bearer ${engram.tenant.admin}` } });
    expect(taken.status).toBe(200);
    expect(cors(taken)).toEqual({});
    expect(taken.headers.get("vary")).toBe("Origin");
    await taken.body?.cancel();
  });

  it("keeps a hostile Host header out of the inspector's CSP", async () => {
    const csp = await new Promise<string>((resolve, reject) => {
      const req = request(`${url}/inspector/`, { headers: { host: "evil.example; script-src * 'unsafe-inline'" } }, (res) => {
        res.resume();
        resolve(String(res.headers["content-security-policy"]));
      });
      req.on("error", reject);
      req.end();
    });
    expect(csp).not.toContain("evil.example");
    expect(csp).not.toContain("unsafe-inline");
    expect(csp).toContain("connect-src 'self'");
  });

  it("serves GraphiQL gzipped with a long max-age and an ETag, and 304 on a repeat", async () => {
    const headers = { accept: "text/html", "accept-encoding": "gzip" };
    const first = await engram.app.yoga.fetch("http://engram.test/graphql", { headers });
    expect(first.status).toBe(200);
    expect(first.headers.get("cache-control")).toMatch(/max-age=86400/);
    expect(first.headers.get("content-encoding")).toBe("gzip");
    const etag = first.headers.get("etag")!;
    expect(etag).toMatch(/^".+"$/);
    const again = await engram.app.yoga.fetch("http://engram.test/graphql", { headers: { ...headers, "if-none-match": etag } });
    expect(again.status).toBe(304);
    const plain = await engram.app.yoga.fetch("http://engram.test/graphql", { headers: { accept: "text/html" } });
    expect(await plain.text()).toContain("<title>Engram</title>");
  });

  it("limits model-spending fields per request", async () => {
    const aliased = (n: number) =>
      `{ ${Array.from({ length: n }, (_, i) => `c${i}: context(input: { conversationId: "none", message: "hi" }) { totalTokens }`).join(" ")} }`;
    const tooMany = await engram.gql(aliased(4), {}, engram.tenant.reader);
    expect(tooMany.errors?.[0].extensions?.code).toBe("QUERY_TOO_COMPLEX");
    expect(tooMany.errors?.[0].message).toMatch(/at most 3 context or recall fields/);
    const allowed = await engram.gql(aliased(3), {}, engram.tenant.reader);
    expect(allowed.errors?.[0].extensions?.code).toBe("NOT_FOUND");
  });

  it("announces a 65 s keep-alive (Node's default is 5 s) on its answers", async () => {
    const keepAlive = await new Promise<string>((resolve, reject) => {
      const req = request(`${url}/healthz`, (res) => {
        res.resume();
        resolve(String(res.headers["keep-alive"]));
      });
      req.on("error", reject);
      req.end();
    });
    expect(keepAlive).toBe("timeout=65");
  });

  it("drops a request whose headers never finish", async () => {
    const { port } = new URL(url);
    const socket = net.connect(Number(port), "127.0.0.1");
    let closed = false;
    let answer = "";
    socket.on("data", (data) => (answer += data.toString()));
    socket.on("close", () => (closed = true));
    socket.write("POST /graphql HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    await until("the server to drop the stalled request", async () => closed, 25_000);
    expect(answer).toMatch(/^HTTP\/1.1 408/);
  });
});
