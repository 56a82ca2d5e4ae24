import { lookup } from "node:dns/promises";
import { createServer, get as httpGet, type Server } from "node:http";
import net, { type AddressInfo } from "node:net";
import { hostname } from "node:os";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { settingsChanged } from "../src/governance/settings.ts";
import { compactTenants } from "../src/work/compact-tenants.ts";
import { baseUrlProblem, billedUnanswered, guardedFetch, guardedLookup, isPrivateAddress, ModelCallError, noteExchanges, type Exchanges } from "../src/models/egress.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import { startModelServer, type ModelServer } from "./helpers/model-server.ts";
import { until } from "./helpers/until.ts";

const DAY_MS = 86_400_000;
const LEAK = "INTERNAL-ONLY: db_password=hunter2";
const UPDATE = `mutation($input: UpdateTenantSettingsInput!) { updateTenantSettings(input: $input) { modelRouting { compaction { baseUrl } } } }`;
const APPEND = `mutation($input: AppendEventInput!) { appendEvent(input: $input) { id } }`;
const JOB_RUNS = `{ jobRuns(name: "memory.compact") { status result error } }`;
const compactAnswer = () => JSON.stringify({ title: "Digest", summary: "- kept", tags: ["compacted"] });

/** A loopback HTTP server that counts requests and answers with `handler`. */
async function startHttp(handler: (res: import("node:http").ServerResponse) => void) {
  let hits = 0;
  const server: Server = createServer((req, res) => {
    hits++;
    req.resume();
    handler(res);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return { port, url: `http://127.0.0.1:${port}/v1`, hits: () => hits, stop: () => new Promise((r) => server.close(r)) };
}

async function appendOld(engram: TestEngram, scopeRef: string) {
  for (let i = 0; i < 3; i++) {
    const { errors } = await engram.gql(
      APPEND,
      {
        input: {
          scope: "PROJECT",
          scopeRef,
          kind: "note",
          body: `note ${i}`,
          source: "test",
          sourceRef: `${scopeRef}-${i}`,
          occurredAt: new Date(Date.now() - (200 - i) * DAY_MS).toISOString(),
        },
      },
      engram.tenant.writer,
    );
    expect(errors).toBeUndefined();
  }
}

/** Plants a route as a stored setting, past the settings-time check (as a DNS name would pass it). */
async function plantRoute(engram: TestEngram, baseUrl: string) {
  await engram.services.db.tenantSettings.upsert({
    where: { tenantId: engram.tenant.tenantId },
    create: { tenantId: engram.tenant.tenantId, modelRouting: { compaction: { baseUrl } } },
    update: { modelRouting: { compaction: { baseUrl } } },
  });
  settingsChanged(engram.tenant.tenantId); // written past updateTenantSettings
}

async function compactionErrors(engram: TestEngram, scopeRef: string): Promise<string> {
  await appendOld(engram, scopeRef);
  await compactTenants(engram.services.deps, { tenantId: engram.tenant.tenantId });
  const { data, errors } = await engram.gql(JOB_RUNS);
  expect(errors).toBeUndefined();
  return JSON.stringify(data.jobRuns[0]);
}

describe("address ranges", () => {
  it("calls loopback, private, link-local, metadata, unique-local, unspecified, IPv4-translated, local NAT64 and Teredo addresses private", () => {
    const blocked = [
      "127.0.0.1", "127.9.9.9", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "169.254.169.254",
      "100.64.0.1", "0.0.0.0", "::", "::1", "fd00:ec2::254", "fc00::1", "fe80::1", "::ffff:127.0.0.1",
      "::ffff:7f00:1", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:7f00:1::", "224.0.0.1", "255.255.255.255",
      "::ffff:0:7f00:1", "::ffff:0:a9fe:a9fe", "64:ff9b:1::a9fe:a9fe", "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    ];
    const open = ["8.8.8.8", "1.1.1.1", "172.32.0.1", "2606:4700:4700::1111", "2001:4860:4860::8888", "::ffff:8.8.8.8"];
    for (const address of blocked) expect(isPrivateAddress(address), address).toBe(true);
    for (const address of open) expect(isPrivateAddress(address), address).toBe(false);
  });

  it("judges base URLs at settings time, allow-list first", () => {
    const none = { allowed: [] };
    for (const url of ["http://127.0.0.1:5432/v1", "http://localhost:6379", "http://2130706433/", "http://0x7f.1/", "http://[::1]/", "http://[fd00:ec2::254]/", "http://169.254.169.254/latest"]) {
      expect(baseUrlProblem(none, url), url).toMatch(/private, loopback or link-local/);
    }
    expect(baseUrlProblem(none, "http://user:pass@models.example/v1")).toMatch(/credentials/);
    // On an allow-listed host too: the query would reach it with whatever the tenant wrote.
    for (const url of ["https://models.example/v1?api-version=1", "http://127.0.0.1:5432/v1?x=", "http://127.0.0.1:5432/v1#frag"]) {
      expect(baseUrlProblem({ allowed: ["127.0.0.1:5432"] }, url), url).toMatch(/query .* or fragment/);
    }
    expect(baseUrlProblem(none, "https://models.example/v1")).toBeNull();
    expect(baseUrlProblem({ allowed: ["127.0.0.1:5432"] }, "http://127.0.0.1:5432/v1")).toBeNull();
    expect(baseUrlProblem({ allowed: ["127.0.0.1:5432"] }, "http://127.0.0.1:6379/v1")).not.toBeNull();
    expect(baseUrlProblem({ allowed: ["localhost"] }, "http://localhost:6379/v1")).toBeNull();
  });

  it("refuses a DNS name that resolves to a private address, at connect time", async () => {
    const name = hostname();
    const resolved = await lookup(name).catch(() => null);
    if (!resolved || !isPrivateAddress(resolved.address)) return; // this machine's name is public: nothing to prove
    const target = await startHttp((res) => res.end("{}"));
    try {
      const error = await guardedFetch({ allowed: [] }, { idleTimeoutMs: 5_000, maxBodyBytes: 1_000_000 })(`http://${name}:${target.port}/v1/chat/completions`, { method: "POST", body: "{}" }).catch((e) => e);
      expect(error).toBeInstanceOf(ModelCallError);
      expect(error.kind).toBe("refused");
      expect(target.hits()).toBe(0);
    } finally {
      await target.stop();
    }
  });
});

describe("names on the operator's network", () => {
  type Resolve = Parameters<typeof guardedLookup>[1];
  const answering = (error: NodeJS.ErrnoException | null, addresses: { address: string; family: number }[]) =>
    ((_name: string, _options: object, callback: (e: NodeJS.ErrnoException | null, a: unknown) => void) => callback(error, addresses)) as unknown as Resolve;
  const lookupError = (resolve: Resolve) =>
    new Promise<ModelCallError>((done) => guardedLookup("db.corp.example", resolve)("db.corp.example", {}, (error) => done(error as unknown as ModelCallError)));

  it("are refused in the same words whether the name is unknown or private, so a route cannot list them", async () => {
    const unknown = Object.assign(new Error("getaddrinfo ENOTFOUND db.corp.example"), { code: "ENOTFOUND" });
    const [missing, internalName, mixed] = await Promise.all([
      lookupError(answering(unknown, [])),
      lookupError(answering(null, [{ address: "10.0.0.7", family: 4 }])),
      lookupError(answering(null, [{ address: "8.8.8.8", family: 4 }, { address: "10.0.0.7", family: 4 }])),
    ]);
    for (const error of [missing, internalName, mixed]) expect(error).toBeInstanceOf(ModelCallError);
    expect(internalName.message).toBe(missing.message);
    expect(mixed.message).toBe(missing.message);
    expect(missing.message).toMatch(/did not resolve to a public address/);
    // A resolver's outage may pass; a private address will not.
    expect([missing.kind, internalName.kind]).toEqual(["failed", "refused"]);
  });

  it("are checked on every connection, even one the process's shared pool already holds open", async () => {
    const target = await startHttp((res) => res.end("{}"));
    try {
      // Another part of the process talks to that host through Node's shared (keep-alive) agent.
      await new Promise<void>((resolve, reject) => httpGet(`http://localhost:${target.port}/`, (res) => res.resume().on("end", resolve)).on("error", reject));
      expect(target.hits()).toBe(1);
      const error = await guardedFetch({ allowed: [] }, { idleTimeoutMs: 5_000, maxBodyBytes: 1_000_000 })(`http://localhost:${target.port}/v1/embeddings`, { method: "POST", body: "{}" }).catch((e) => e);
      expect(error).toBeInstanceOf(ModelCallError);
      expect(error.kind).toBe("refused");
      expect(target.hits()).toBe(1);
    } finally {
      await target.stop();
    }
  });
});

describe("tenant model routes cannot reach the operator's network", () => {
  let engram: TestEngram;
  let model: ModelServer;
  let internal: Awaited<ReturnType<typeof startHttp>>;

  beforeAll(async () => {
    internal = await startHttp((res) => res.writeHead(403, { "content-type": "text/plain" }).end(LEAK));
    ({ model, engram } = await startEngramWithModel({ respond: compactAnswer, env: { ENGRAM_EMBEDDINGS: "offline" } }));
  });
  afterAll(async () => {
    await engram?.stop();
    await model?.stop();
    await internal?.stop();
  });

  it("refuses private, loopback and metadata base URLs and URLs with credentials with BAD_USER_INPUT, writing nothing", async () => {
    const urls = [
      "http://127.0.0.1:5432/v1",
      "http://localhost:6379",
      "http://[::1]:8080/v1",
      "http://169.254.169.254/latest/meta-data",
      "http://[fd00:ec2::254]/",
      "http://0.0.0.0:4000/",
      "http://2130706433/v1",
      "http://[::ffff:127.0.0.1]/v1",
      "http://10.0.0.5/v1",
      "http://user:pass@models.example/v1",
      `http://user:pass@127.0.0.1:${internal.port}/v1`,
    ];
    const before = await engram.services.db.tenantSettings.findUnique({ where: { tenantId: engram.tenant.tenantId } });
    for (const baseUrl of urls) {
      const { errors } = await engram.gql(UPDATE, { input: { modelRouting: { compaction: { baseUrl } } } });
      expect(errors?.[0].extensions?.code, baseUrl).toBe("BAD_USER_INPUT");
      expect(errors?.[0].message, baseUrl).toMatch(/baseUrl/);
      expect(errors?.[0].message).not.toContain("pass@");
    }
    expect(await engram.services.db.tenantSettings.findUnique({ where: { tenantId: engram.tenant.tenantId } })).toEqual(before);
    expect(await engram.services.db.auditLog.count({ where: { action: "settings.update" } })).toBe(0);
    expect(internal.hits()).toBe(0);
  });

  it("checks at call time: a stored route to a private address is never called", async () => {
    await plantRoute(engram, internal.url);
    const run = await compactionErrors(engram, "planted");
    expect(internal.hits()).toBe(0);
    expect(run).toMatch(/private, loopback or link-local/);
    expect(run).not.toContain("hunter2");
  });

  it("never shows credentials a stored URL still holds", async () => {
    await plantRoute(engram, "https://user:hunter2@models.example/v1");
    const { data } = await engram.gql(`{ tenantSettings { modelRouting { compaction { baseUrl effectiveBaseUrl } } } }`);
    expect(JSON.stringify(data)).not.toContain("hunter2");
    expect(data.tenantSettings.modelRouting.compaction.baseUrl).toBe("https://models.example/v1");
    await engram.services.db.tenantSettings.update({ where: { tenantId: engram.tenant.tenantId }, data: { modelRouting: {} } });
    settingsChanged(engram.tenant.tenantId); // written past updateTenantSettings
  });

  it("keeps the operator's own route (OPENAI_BASE_URL on loopback) working", async () => {
    const before = model.requests.length;
    const run = await compactionErrors(engram, "operator");
    expect(model.requests.length).toBeGreaterThan(before);
    expect(JSON.parse(run).status).toBe("SUCCEEDED");
  });
});

describe("allow-listed hosts: no redirects, no provider bodies", () => {
  let engram: TestEngram;
  let model: ModelServer;
  let internal: Awaited<ReturnType<typeof startHttp>>;
  let target: ModelServer;
  let redirector: Awaited<ReturnType<typeof startHttp>>;
  let huge: Awaited<ReturnType<typeof startHttp>>;

  beforeAll(async () => {
    // A chat completion whose answer is 3 MB: read whole, it was held in memory however large.
    huge = await startHttp((res) => {
      const answer = { id: "x", object: "chat.completion", created: 0, model: "m", choices: [{ index: 0, finish_reason: "stop", message: { role: "assistant", content: "x".repeat(3_000_000) } }] };
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(answer));
    });
    internal = await startHttp((res) => res.writeHead(403, { "content-type": "text/plain" }).end(LEAK));
    target = await startModelServer();
    target.respond(compactAnswer);
    redirector = await startHttp((res) => res.writeHead(302, { location: `${target.url}/chat/completions` }).end(LEAK));
    ({ model, engram } = await startEngramWithModel({
      respond: compactAnswer,
      env: { ENGRAM_EMBEDDINGS: "offline", ENGRAM_MODEL_HOST_ALLOWLIST: `127.0.0.1:${internal.port}, 127.0.0.1:${redirector.port}, 127.0.0.1:${huge.port}` },
    }));
  });
  afterAll(async () => {
    await engram?.stop();
    await Promise.all([model?.stop(), target?.stop(), internal?.stop(), redirector?.stop(), huge?.stop()]);
  });

  it("only allow-listed hosts pass", async () => {
    const ok = await engram.gql(UPDATE, { input: { modelRouting: { compaction: { baseUrl: internal.url } } } });
    expect(ok.errors).toBeUndefined();
    const refused = await engram.gql(UPDATE, { input: { modelRouting: { compaction: { baseUrl: target.url } } } });
    expect(refused.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
  });

  it("records a short typed reason, never the provider's error body", async () => {
    await engram.gql(UPDATE, { input: { modelRouting: { compaction: { baseUrl: internal.url } } } });
    const run = await compactionErrors(engram, "leaky");
    expect(internal.hits()).toBeGreaterThan(0);
    expect(run).toContain("model provider answered 403");
    expect(run).not.toContain("hunter2");
    expect(run).not.toContain("INTERNAL-ONLY");
  });

  it("does not follow a redirect", async () => {
    await engram.gql(UPDATE, { input: { modelRouting: { compaction: { baseUrl: redirector.url } } } });
    const run = await compactionErrors(engram, "redirected");
    expect(redirector.hits()).toBeGreaterThan(0);
    expect(target.requests).toHaveLength(0);
    expect(run).toMatch(/answered 302 \(a redirect, which is not followed\)/);
    expect(run).not.toContain("hunter2");
  });

  it("does not read an answer past its size limit", async () => {
    await engram.gql(UPDATE, { input: { modelRouting: { compaction: { baseUrl: huge.url } } } });
    const run = await compactionErrors(engram, "huge");
    expect(huge.hits()).toBeGreaterThan(0);
    expect(run).toMatch(/answer is larger than 2097152 bytes/);
  });
});

describe("a provider that keeps sending", () => {
  it("has the exchange cut with a typed error once its body passes the limit, declared or not", async () => {
    let sent = 0;
    const endless = await startHttp((res) => {
      res.writeHead(200, { "content-type": "application/json" });
      const chunk = Buffer.alloc(64 * 1024, "x");
      // Up to 200 MB, as fast as the reader takes it (without a limit, all of it is read).
      const pump = () => {
        while (sent < 200_000_000 && !res.destroyed) {
          sent += chunk.length;
          if (!res.write(chunk)) return void res.once("drain", pump);
        }
        res.end();
      };
      pump();
    });
    const declared = await startHttp((res) => res.writeHead(200, { "content-type": "application/json", "content-length": "5000000" }).end("x".repeat(5_000_000)));
    try {
      const fetch = guardedFetch({ allowed: [`127.0.0.1:${endless.port}`, `127.0.0.1:${declared.port}`] }, { idleTimeoutMs: 5_000, maxBodyBytes: 1_000_000 });
      const response = await fetch(`${endless.url}/chat/completions`, { method: "POST", body: "{}" });
      const error = await response.text().catch((e) => e);
      expect(error).toBeInstanceOf(ModelCallError);
      expect(error.message).toMatch(/larger than 1000000 bytes/);
      expect(sent).toBeLessThan(50_000_000);
      const refused = await fetch(`${declared.url}/chat/completions`, { method: "POST", body: "{}" }).catch((e) => e);
      expect(refused).toBeInstanceOf(ModelCallError);
      expect(refused.message).toMatch(/larger than 1000000 bytes/);
    } finally {
      await Promise.all([endless.stop(), declared.stop()]);
    }
  });

  it("stops draining an error body that never ends", async () => {
    let sent = 0;
    let closed = false;
    const endlessError = await startHttp((res) => {
      res.writeHead(500, { "content-type": "text/plain" });
      res.on("close", () => (closed = true));
      const chunk = Buffer.alloc(64 * 1024, "x");
      const pump = () => {
        while (!res.destroyed && sent < 500_000_000) {
          sent += chunk.length;
          if (!res.write(chunk)) return void res.once("drain", pump);
        }
        res.end();
      };
      pump();
    });
    try {
      const fetch = guardedFetch({ allowed: [`127.0.0.1:${endlessError.port}`] }, { idleTimeoutMs: 5_000, maxBodyBytes: 1_000_000 });
      const response = await fetch(`${endlessError.url}/chat/completions`, { method: "POST", body: "{}" });
      expect(response.status).toBe(500);
      await until("the provider's connection closed", async () => closed, 5_000);
      expect(sent).toBeLessThan(50_000_000);
    } finally {
      await endlessError.stop();
    }
  });
});

describe("what a call's requests came to, for the bill", () => {
  it("counts a request sent whole, and one the provider refused, but not one still being written", async () => {
    const stalling = await startHttp((res) => res.writeHead(200, { "content-type": "application/json" }).write("{"));
    const failing = await startHttp((res) => res.writeHead(500).end());
    // Takes the connection and never reads it: a large request is never sent whole.
    const deaf = net.createServer((socket) => socket.pause());
    await new Promise<void>((resolve) => deaf.listen(0, "127.0.0.1", resolve));
    const deafPort = (deaf.address() as AddressInfo).port;
    const hosts = [stalling.port, failing.port, deafPort].map((port) => `127.0.0.1:${port}`);
    const fetch = guardedFetch({ allowed: hosts }, { idleTimeoutMs: 300, maxBodyBytes: 1_000_000 });
    const noted = async (url: string, body: string) => {
      const exchanges: Exchanges = { sent: 0, refused: 0 };
      await noteExchanges(exchanges, async () => {
        const response = await fetch(url, { method: "POST", body });
        await response.text();
      }).catch(() => undefined);
      return exchanges;
    };
    try {
      const stalled = await noted(`${stalling.url}/chat/completions`, "{}");
      expect(stalled).toEqual({ sent: 1, refused: 0 });
      expect(billedUnanswered(stalled)).toBe(true);
      const refused = await noted(`${failing.url}/chat/completions`, "{}");
      expect(refused).toEqual({ sent: 1, refused: 1 });
      expect(billedUnanswered(refused)).toBe(false);
      const unsent = await noted(`http://127.0.0.1:${deafPort}/v1/embeddings`, "x".repeat(64 * 1024 * 1024));
      expect(unsent).toEqual({ sent: 0, refused: 0 });
      expect(billedUnanswered(unsent)).toBe(false);
    } finally {
      deaf.close();
      await Promise.all([stalling.stop(), failing.stop()]);
    }
  });
});

describe("a provider that stalls in its body", () => {
  it("has the exchange cut with a typed error once nothing arrives for the idle timeout", async () => {
    const stalling = await startHttp((res) => res.writeHead(200, { "content-type": "application/json" }).write('{"choices":['));
    const answering = await startHttp((res) => res.writeHead(200, { "content-type": "application/json" }).end('{"ok":true}'));
    try {
      const fetch = guardedFetch({ allowed: [`127.0.0.1:${stalling.port}`, `127.0.0.1:${answering.port}`] }, { idleTimeoutMs: 300, maxBodyBytes: 1_000_000 });
      // The headers arrive, so the response resolves; its body never ends.
      const response = await fetch(`${stalling.url}/chat/completions`, { method: "POST", body: "{}" });
      expect(response.status).toBe(200);
      const error = await response.text().catch((e) => e);
      expect(error).toBeInstanceOf(ModelCallError);
      expect(error.message).toMatch(/stalled: nothing received for 300 ms/);
      // A provider that answers is not affected, on a connection kept alive past the timeout too.
      for (let i = 0; i < 2; i++) {
        const ok = await fetch(`${answering.url}/chat/completions`, { method: "POST", body: "{}" });
        expect(await ok.json()).toEqual({ ok: true });
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    } finally {
      await Promise.all([stalling.stop(), answering.stop()]);
    }
  });
});
