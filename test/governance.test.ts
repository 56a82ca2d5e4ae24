import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { effectiveModelName, settingsChanged } from "../src/governance/settings.ts";
import { readEnv } from "../src/env.ts";
import { compactTenants, compactTenantsUntilDone } from "../src/work/compact-tenants.ts";
import { forTenant } from "../src/db.ts";
import { budgetStatus } from "../src/governance/budget.ts";
import { CustomPatternPool, redactTexts, DEFAULT_REDACTION } from "../src/governance/redaction.ts";
import { recordModelUsage } from "../src/governance/usage.ts";
import { startEngramWithModel, startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { startModelServer, type ChatRequest, type ModelServer } from "./helpers/model-server.ts";
import { memoryScript } from "./helpers/scripted-memory-model.ts";
import { until } from "./helpers/until.ts";
import { recordTurn } from "./helpers/turns.ts";

const DAY_MS = 86_400_000;
const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);
const daysAgo = (days: number) => new Date(Date.now() - days * DAY_MS).toISOString();
const SECRET = "test-engram-secret-0123456789";
const TENANT_KEY = "sk-tenant-a-Zx9fQ2LmP8vRt4WkYb7NcA3hJ6sD";

const UPDATE = /* GraphQL */ `
  mutation($input: UpdateTenantSettingsInput!) {
    updateTenantSettings(input: $input) {
      retentionDays monthlyTokenBudget
      compaction { minEvents olderThanDays schedule }
      modelRouting {
        cheap { baseUrl model hasApiKey effectiveModel }
        compaction { baseUrl model hasApiKey effectiveBaseUrl effectiveModel }
        embedding { baseUrl model hasApiKey }
      }
      redaction { detectors { email phone card iban secret ip } custom { name pattern flags placeholder } }
      prices { model inputPerMillion outputPerMillion }
    }
  }
`;
const SETTINGS = UPDATE.replace("mutation($input: UpdateTenantSettingsInput!)", "query").replace(
  "updateTenantSettings(input: $input)",
  "tenantSettings",
);
const AUDIT = `query($first: Int, $after: String) { auditLog(first: $first, after: $after) { edges { cursor node { id action apiKeyId changes createdAt } } pageInfo { hasNextPage endCursor } } }`;
const BUDGET = `{ budgetStatus { spent limit paused pausedSince periodStart periodEnd } }`;
const APPEND = `mutation($input: AppendEventInput!) { appendEvent(input: $input) { id } }`;

const compactAnswer = (request: ChatRequest) => {
  const scope = /^Scope: (\S+ \S+)/.exec(request.messages.find((m) => m.role === "user")?.content ?? "")?.[1] ?? "?";
  return JSON.stringify({ title: `Digest of ${scope}`, summary: "- kept", tags: ["compacted"] });
};

async function appendOld(engram: TestEngram, key: string, scopeRef: string, bodies: string[]) {
  for (const [i, body] of bodies.entries()) {
    const { errors } = await engram.gql(
      APPEND,
      { input: { scope: "PROJECT", scopeRef, kind: "note", body, source: "test", sourceRef: `${scopeRef}-${i}`, occurredAt: daysAgo(200 - i) } },
      key,
    );
    expect(errors).toBeUndefined();
  }
}

describe("tenant settings, routing, budgets, redaction and cost", () => {
  let engram: TestEngram;
  let fallback: ModelServer;
  let serverA: ModelServer;
  let serverB: ModelServer;

  beforeAll(async () => {
    [fallback, serverA, serverB] = await Promise.all([startModelServer(), startModelServer(), startModelServer()]);
    for (const server of [fallback, serverA, serverB]) server.respond(compactAnswer);
    ({ engram } = await startEngramWithModel({
      model: fallback,
      apiKey: "server-key",
      // The tenants' own model servers are on loopback: the operator allows it.
      env: { ENGRAM_SECRET: SECRET, ENGRAM_EMBEDDINGS: "offline", ENGRAM_MODEL_HOST_ALLOWLIST: "127.0.0.1" },
    }));
  });
  afterAll(async () => {
    await engram?.stop();
    await Promise.all([fallback, serverA, serverB].map((s) => s?.stop()));
  });

  it("starts from the product's defaults", async () => {
    const { data, errors } = await engram.gql(SETTINGS);
    expect(errors).toBeUndefined();
    expect(data.tenantSettings).toMatchObject({
      retentionDays: 180,
      monthlyTokenBudget: null,
      compaction: { minEvents: 3, olderThanDays: 90, schedule: "17 6 * * *" },
      modelRouting: { cheap: { baseUrl: null, model: null, hasApiKey: false, effectiveModel: "gpt-4o-mini" } },
      redaction: { detectors: { email: true, phone: true, card: true, iban: true, secret: true, ip: true }, custom: [] },
      prices: [],
    });
  });

  it("is for admins only: other roles get FORBIDDEN and change nothing", async () => {
    for (const key of [engram.tenant.writer, engram.tenant.reader]) {
      const read = await engram.gql(SETTINGS, {}, key);
      expect(read.errors?.[0].extensions?.code).toBe("FORBIDDEN");
      const write = await engram.gql(UPDATE, { input: { retentionDays: 1 } }, key);
      expect(write.errors?.[0].extensions?.code).toBe("FORBIDDEN");
      const audit = await engram.gql(AUDIT, {}, key);
      expect(audit.errors?.[0].extensions?.code).toBe("FORBIDDEN");
    }
    expect(await engram.services.db.auditLog.count({ where: { action: "settings.update" } })).toBe(0);
  });

  it("refuses invalid settings with BAD_USER_INPUT and writes nothing", async () => {
    const before = await engram.services.db.tenantSettings.findUniqueOrThrow({ where: { tenantId: engram.tenant.tenantId } });
    const invalid = [
      { retentionDays: -1 },
      { compaction: { minEvents: 1 } },
      { compaction: { schedule: "every day" } },
      { monthlyTokenBudget: -5 },
      { modelRouting: { cheap: { baseUrl: "ftp://models.example" } } },
      { redaction: { custom: [{ name: "hostile", pattern: "(?=a)" }] } },
      { redaction: { custom: [{ name: "broken", pattern: "([a-z" }] } },
      { redaction: { custom: [{ name: "backref", pattern: "(a)\\1" }] } },
      { prices: [{ model: "m", inputPerMillion: -1, outputPerMillion: 1 }] },
      // A valid part does not get written when another part is invalid.
      { retentionDays: 30, redaction: { custom: [{ name: "x", pattern: "(\\w)\\1" }] } },
    ];
    for (const input of invalid) {
      const { errors } = await engram.gql(UPDATE, { input });
      expect(errors?.[0].extensions?.code, JSON.stringify(input)).toBe("BAD_USER_INPUT");
    }
    const after = await engram.services.db.tenantSettings.findUniqueOrThrow({ where: { tenantId: engram.tenant.tenantId } });
    expect(after).toEqual(before);
    expect(await engram.services.db.auditLog.count({ where: { action: "settings.update" } })).toBe(0);
  });

  it("stores a tenant's model API key encrypted, never returns it, and audits changes without it", async () => {
    const { data, errors } = await engram.gql(UPDATE, {
      input: {
        retentionDays: 30,
        modelRouting: { compaction: { baseUrl: serverA.url, model: "a-compactor", apiKey: TENANT_KEY } },
      },
    });
    expect(errors).toBeUndefined();
    expect(data.updateTenantSettings.retentionDays).toBe(30);
    expect(data.updateTenantSettings.modelRouting.compaction).toEqual({
      baseUrl: serverA.url,
      model: "a-compactor",
      hasApiKey: true,
      effectiveBaseUrl: serverA.url,
      effectiveModel: "a-compactor",
    });
    expect(JSON.stringify(data)).not.toContain(TENANT_KEY);

    // At rest: neither the settings row nor the audit log holds the key in clear.
    const rows = await engram.services.db.$queryRawUnsafe<{ row: string }[]>(
      `SELECT row_to_json(s)::text AS row FROM "TenantSettings" s UNION ALL SELECT row_to_json(a)::text FROM "AuditLog" a`,
    );
    expect(rows.length).toBeGreaterThan(0);
    for (const { row } of rows) expect(row).not.toContain(TENANT_KEY);
    const stored = await engram.services.db.tenantSettings.findUniqueOrThrow({ where: { tenantId: engram.tenant.tenantId } });
    expect((stored.modelRouting as any).compaction.apiKeyEncrypted).toMatch(/^v1:/);

    // Rotating the key, then another change: the audit log says who, what and when.
    await engram.gql(UPDATE, { input: { modelRouting: { compaction: { apiKey: `${TENANT_KEY}-2` } } } });
    await engram.gql(UPDATE, { input: { monthlyTokenBudget: 1_000_000, redaction: { detectors: { ip: false } } } });
    const viewer = await engram.gql(`{ viewer { apiKeyId } }`);
    const page1 = await engram.gql(AUDIT, { first: 2 });
    expect(page1.errors).toBeUndefined();
    const log = page1.data.auditLog;
    expect(log.pageInfo.hasNextPage).toBe(true);
    const page2 = await engram.gql(AUDIT, { first: 2, after: log.pageInfo.endCursor });
    // Newest first: the three changes, then the tenant's keys being made (apiKey.create).
    const entries = [...log.edges, ...page2.data.auditLog.edges].map((e: any) => e.node).filter((e: any) => e.action !== "apiKey.create");
    expect(entries).toHaveLength(3);
    expect(JSON.stringify(entries)).not.toContain(TENANT_KEY);
    for (const entry of entries) {
      expect(entry.action).toBe("settings.update");
      expect(entry.apiKeyId).toBe(viewer.data.viewer.apiKeyId);
    }
    const [latest, rotation, first] = entries;
    expect(latest.changes).toMatchObject({
      monthlyTokenBudget: { from: null, to: 1_000_000 },
      redaction: { from: { detectors: { ip: true } }, to: { detectors: { ip: false } } },
    });
    expect(rotation.changes["modelRouting.compaction"].to.apiKey).toBe("[changed]");
    expect(first.changes).toMatchObject({
      retentionDays: { from: 180, to: 30 },
      "modelRouting.compaction": { from: null, to: { baseUrl: serverA.url, model: "a-compactor", apiKey: "[set]" } },
    });
    // The other tenant sees none of it.
    const theirs = await engram.gql(AUDIT, {}, engram.other.admin);
    expect(theirs.data.auditLog.edges.map((e: any) => e.node.action)).not.toContain("settings.update");
    await engram.gql(UPDATE, { input: { monthlyTokenBudget: null, redaction: { detectors: { ip: true } } } });
  });

  it("keeps both of two changes saved at once, and audits each against what the other wrote", async () => {
    // Each change used to be computed against the row as read before its write: of two saved
    // together, the second undid the first (its detector or route), whose audit row said done.
    const reset = { redaction: { detectors: { ip: true, email: true } }, modelRouting: { cheap: null, embedding: null } };
    for (let round = 0; round < 6; round++) {
      expect((await engram.gql(UPDATE, { input: reset })).errors).toBeUndefined();
      const answers = await Promise.all([
        engram.gql(UPDATE, { input: { redaction: { detectors: { ip: false } }, modelRouting: { cheap: { model: "x" } } } }),
        engram.gql(UPDATE, { input: { redaction: { detectors: { email: false } }, modelRouting: { embedding: { model: "y" } } } }),
      ]);
      for (const answer of answers) expect(answer.errors).toBeUndefined();
      const { data } = await engram.gql(SETTINGS);
      expect(data.tenantSettings.redaction.detectors, `round ${round}`).toMatchObject({ ip: false, email: false });
      expect(data.tenantSettings.modelRouting.cheap.model, `round ${round}`).toBe("x");
      expect(data.tenantSettings.modelRouting.embedding.model, `round ${round}`).toBe("y");
      // One of the two was made from what the other wrote (the rows can share a millisecond, so either order).
      const [a, b] = (await engram.gql(AUDIT, { first: 2 })).data.auditLog.edges.map((e: any) => e.node.changes.redaction);
      expect(same(a.from, b.to) || same(b.from, a.to), JSON.stringify([a, b])).toBe(true);
    }
    expect((await engram.gql(UPDATE, { input: reset })).errors).toBeUndefined();
  });

  it("audits every key made and revoked: which key did it, the key's role, name and prefix, never the key", async () => {
    const KEY_AUDIT = `{ auditLog(first: 100) { edges { node { action apiKeyId changes } } } }`;
    const keyRows = async (key?: string) =>
      (await engram.gql(KEY_AUDIT, {}, key)).data.auditLog.edges.map((e: any) => e.node).filter((n: any) => n.action.startsWith("apiKey."));
    const before = await keyRows();
    // The tenant's own keys, made as the CLI makes them: no key did it.
    expect(before.map((n: any) => [n.action, n.apiKeyId, n.changes.target.role, n.changes.via])).toEqual([
      ["apiKey.create", null, "READER", "cli"],
      ["apiKey.create", null, "WRITER", "cli"],
      ["apiKey.create", null, "ADMIN", "cli"],
    ]);
    const refused = await engram.gql(`mutation { createApiKey(role: ADMIN) { key } }`, {}, engram.tenant.writer);
    expect(refused.errors?.[0].extensions?.code).toBe("FORBIDDEN");
    expect(await keyRows()).toHaveLength(before.length);

    const admin = (await engram.gql(`{ viewer { apiKeyId } }`)).data.viewer.apiKeyId;
    const made = await engram.gql(`mutation { createApiKey(role: READER, name: "dashboard") { key id } }`);
    const { key, id } = made.data.createApiKey;
    for (let i = 0; i < 2; i++) expect((await engram.gql(`mutation($id: ID!) { revokeApiKey(id: $id) { revokedAt } }`, { id })).errors).toBeUndefined();
    const rows = (await keyRows()).slice(0, -before.length);
    const target = { apiKeyId: id, role: "READER", name: "dashboard", prefix: key.slice(0, 10) };
    // Revoked twice, recorded once: the second changed nothing.
    expect(rows).toEqual([
      { action: "apiKey.revoke", apiKeyId: admin, changes: { target, via: "graphql" } },
      { action: "apiKey.create", apiKeyId: admin, changes: { target, via: "graphql" } },
    ]);
    const stored = await engram.services.db.$queryRawUnsafe<{ row: string }[]>(`SELECT row_to_json(a)::text AS row FROM "AuditLog" a`);
    for (const { row } of stored) expect(row).not.toContain(key);
    // The other tenant's log has its own keys only.
    expect(JSON.stringify(await keyRows(engram.other.admin))).not.toContain(id);
  });

  it("routes each tenant's compaction to its own model server, per its settings", async () => {
    await engram.gql(UPDATE, { input: { modelRouting: { compaction: { baseUrl: serverB.url, model: "b-compactor" } } } }, engram.other.admin);
    await appendOld(engram, engram.tenant.writer, "route-a", ["alpha one", "alpha two", "alpha three"]);
    await appendOld(engram, engram.other.writer, "route-b", ["bravo one", "bravo two", "bravo three"]);
    const counts = [fallback, serverA, serverB].map((s) => s.requests.length);

    const { done: runs } = await compactTenants(engram.services.deps, {});
    expect(runs.map((r) => r.status)).toEqual(["SUCCEEDED", "SUCCEEDED"]);
    const [toFallback, toA, toB] = [fallback, serverA, serverB].map((s, i) => s.requests.slice(counts[i]));
    expect(toFallback).toEqual([]);
    expect(toA.map((r) => r.model)).toEqual(["a-compactor"]);
    expect(toB.map((r) => r.model)).toEqual(["b-compactor"]);
    expect(JSON.stringify(toA)).toContain("alpha two");
    expect(JSON.stringify(toA)).not.toContain("bravo");
    expect(JSON.stringify(toB)).toContain("bravo two");
    expect(JSON.stringify(toB)).not.toContain("alpha");

    const usage = async (key: string) =>
      (await engram.gql(`{ modelUsage(groupBy: [PURPOSE, CHAIN]) { rows { purpose chain calls } } }`, {}, key)).data.modelUsage.rows;
    expect(await usage(engram.tenant.admin)).toEqual([{ purpose: "memory:a-compactor", chain: "compactor", calls: 1 }]);
    expect(await usage(engram.other.admin)).toEqual([{ purpose: "memory:b-compactor", chain: "compactor", calls: 1 }]);
  });

  it("redacts every planted secret before the model sees it, and stores the originals", async () => {
    const planted = {
      email: "jane.doe@example.com",
      phone: "+44 20 7946 0958",
      card: "4111 1111 1111 1111",
      iban: "DE89 3704 0044 0532 0130 00",
      aws: "AKIAIOSFODNN7EXAMPLE",
      jwt: "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
      ipv4: "203.0.113.42",
      ipv6: "2001:db8::8a2e:370:7334",
      custom: "ORDER-778812",
    };
    const { errors } = await engram.gql(UPDATE, {
      input: { redaction: { custom: [{ name: "order", pattern: "ORDER-\\d{4,}", flags: "i" }] } },
    });
    expect(errors).toBeUndefined();
    await appendOld(engram, engram.tenant.writer, "secrets", [
      `Client ${planted.email} called from ${planted.phone} about the renewal.`,
      `Paid with ${planted.card}; refund to ${planted.iban} for ${planted.custom}.`,
      `Ops shared ${planted.aws} and token ${planted.jwt} from ${planted.ipv4} / ${planted.ipv6}.`,
    ]);
    const from = serverA.requests.length;
    const { done: [run] } = await compactTenants(engram.services.deps, { tenantId: engram.tenant.tenantId });
    expect(run.status).toBe("SUCCEEDED");
    const sent = JSON.stringify(serverA.requests.slice(from));
    expect(sent).toContain("renewal");
    for (const [kind, value] of Object.entries(planted)) expect(sent, kind).not.toContain(value);
    for (const placeholder of ["[EMAIL]", "[PHONE]", "[CARD]", "[IBAN]", "[SECRET]", "[IP]", "[ORDER]"]) {
      expect(sent).toContain(placeholder);
    }
    // Stored data is unchanged: the events still hold the originals.
    const bodies = (
      await engram.services.db.memoryEvent.findMany({ where: { tenantId: engram.tenant.tenantId, scopeRef: "secrets" } })
    ).map((e) => e.body).join("\n");
    for (const value of Object.values(planted)) expect(bodies).toContain(value);
    const usage = await engram.services.db.modelUsage.findFirstOrThrow({
      where: { tenantId: engram.tenant.tenantId },
      orderBy: { createdAt: "desc" },
    });
    expect(usage.redactions).toBe(9);
    const report = await engram.gql(`{ modelUsage { redactions } }`);
    expect(report.data.modelUsage.redactions).toBe(9);

    // The helper for embeddings and other callers applies the same rules.
    const redacted = await engram.services.models.redactForTenant(engram.tenant.tenantId, [`mail ${planted.email} re ${planted.custom}`]);
    expect(redacted).toEqual({ texts: ["mail [EMAIL] re [ORDER]"], redactions: 2 });
    await engram.gql(UPDATE, { input: { redaction: { custom: [] } } });
  });

  it("redacts secrets that start a line of a quoted text, where the quoting puts a letter before them", async () => {
    // Chains quote user text as JSON string literals, so a line break before a secret becomes "\n"
    // and its "n" sits against the secret, where the rules look for a word boundary.
    const lines = ["DE89 3704 0044 0532 0130 00", "AKIAIOSFODNN7EXAMPLE", "020 7946 0958", "<ORDER-99812>"];
    await engram.gql(UPDATE, { input: { redaction: { custom: [{ name: "order", pattern: "\\bORDER-\\d{4,}", flags: "i" }] } } });
    await appendOld(engram, engram.tenant.writer, "line-secrets", [
      `My IBAN is\n${lines[0]}\nand the ops key:\n${lines[1]}`,
      `call me on\n${lines[2]}\nabout\n${lines[3]}`,
      "and the \"renewal\" of the plan.",
    ]);
    const from = serverA.requests.length;
    const { done: [run] } = await compactTenants(engram.services.deps, { tenantId: engram.tenant.tenantId });
    expect(run.status).toBe("SUCCEEDED");
    const sent = JSON.stringify(serverA.requests.slice(from));
    expect(sent).toContain("renewal");
    for (const secret of ["DE89 3704", "AKIAIOSFODNN7EXAMPLE", "7946 0958", "ORDER-99812"]) expect(sent).not.toContain(secret);
    for (const placeholder of ["[IBAN]", "[SECRET]", "[PHONE]", "[ORDER]"]) expect(sent).toContain(placeholder);
    await engram.gql(UPDATE, { input: { redaction: { custom: [] } } });
  });

  it("custom patterns match a long text whole: a match where a 20,000-character cut once fell is still redacted", async () => {
    // Texts used to be matched in pieces of 20,000 characters, cut hard when a line ran on that
    // long, so a ticket across the cut went to the model as it was.
    await engram.gql(UPDATE, { input: { redaction: { custom: [{ name: "ticket", pattern: "TCK-\\d{6}" }] } } });
    const body = "word ".repeat(3_999) + "TCK-123456 was escalated " + "and discussed at length ".repeat(400);
    await appendOld(engram, engram.tenant.writer, "long-line", [body, "second note", "third note"]);
    const from = serverA.requests.length;
    const { done: [run] } = await compactTenants(engram.services.deps, { tenantId: engram.tenant.tenantId });
    expect(run.status).toBe("SUCCEEDED");
    const sent = JSON.stringify(serverA.requests.slice(from).filter((r) => JSON.stringify(r).includes("long-line")));
    expect(sent).toContain("was escalated");
    expect(sent).not.toContain("TCK-123456");
    expect(sent).toContain("[TICKET]");

    // `$` means the end of the text, not the end of a piece of it.
    const rules = { ...DEFAULT_REDACTION, custom: [{ name: "end", pattern: "a+$", flags: "", placeholder: "[END]" }] };
    const { texts, redactions } = await redactTexts(rules, ["a".repeat(50_000) + "b"]);
    expect(redactions).toBe(0);
    expect(texts[0]).toBe("a".repeat(50_000) + "b");
    await engram.gql(UPDATE, { input: { redaction: { custom: [] } } });
  });

  it("embeds on the tenant's embedding route, redacted and metered under chain embed", async () => {
    serverB.embed((input) => input.map(() => [0.1, 0.2, 0.3]));
    await engram.gql(UPDATE, { input: { modelRouting: { embedding: { baseUrl: serverB.url, model: "b-embed" } } } }, engram.other.admin);
    expect(await engram.services.models.embeddingRoute(engram.other.tenantId)).toMatchObject({ baseUrl: serverB.url, model: "b-embed" });
    // The first tenant has no embedding route and the server embeds offline: no remote route.
    expect(await engram.services.models.embeddingRoute(engram.tenant.tenantId)).toBeNull();
    const embeddings = await engram.services.models.embeddings(engram.other.tenantId);
    const vectors = await embeddings!.embedDocuments(["write to jane.doe@example.com", "from 203.0.113.42"]);
    expect(vectors).toEqual([[0.1, 0.2, 0.3], [0.1, 0.2, 0.3]]);
    expect(serverB.embeddingRequests.at(-1)).toEqual(["write to [EMAIL]", "from [IP]"]);
    const usage = await engram.services.db.modelUsage.findFirstOrThrow({
      where: { tenantId: engram.other.tenantId, chain: "embed" },
    });
    // Metered by the tokens the server says it read (this one reports the texts' length), not our count.
    expect(usage).toMatchObject({ purpose: "memory:b-embed", redactions: 2, inputTokens: "write to [EMAIL] from [IP]".length, outputTokens: 0 });
    // A query (a search) is metered too, its row written just after the vector is handed back.
    expect(await embeddings!.embedQuery("call 203.0.113.42")).toEqual([0.1, 0.2, 0.3]);
    await engram.services.models.settled();
    const rows = await engram.services.db.modelUsage.findMany({ where: { tenantId: engram.other.tenantId, chain: "embed" } });
    expect(rows.map((r) => r.redactions).sort()).toEqual([1, 2]);

    // The rows of searches made together are stored together: three queries, one insert (its
    // rows share the statement's time), and settled() stores a gathering before its time is up.
    await Promise.all(["one", "two", "three"].map((text) => embeddings!.embedQuery(text)));
    await engram.services.models.settled();
    const together = await engram.services.db.modelUsage.findMany({ where: { tenantId: engram.other.tenantId, chain: "embed" }, orderBy: { createdAt: "desc" }, take: 3 });
    expect(new Set(together.map((r) => r.createdAt.getTime())).size).toBe(1);
    expect(await engram.services.db.modelUsage.count({ where: { tenantId: engram.other.tenantId, chain: "embed" } })).toBe(5);

    // A server that reports no usage, or 0, is metered by our own count (o200k: "hello world" is 2 tokens).
    for (const mode of ["none", "zero"] as const) {
      serverB.reportEmbeddingUsage(mode);
      try {
        await embeddings!.embedDocuments(["hello world"]);
      } finally {
        serverB.reportEmbeddingUsage("length");
      }
      const counted = await engram.services.db.modelUsage.findFirstOrThrow({
        where: { tenantId: engram.other.tenantId, chain: "embed" },
        orderBy: { createdAt: "desc" },
      });
      expect(counted.inputTokens, mode).toBe(2);
    }
  });

  it("custom patterns run on a linear-time engine: backtracking bombs are harmless, and a run-time limit stays", async () => {
    const bombs = ["(a+)+$", "(a|aa)+$", "(\\w+\\s?){20}$", "\\w*\\w*\\w*\\w*\\w*\\w*\\w*\\w*!"];
    const saved = await engram.gql(UPDATE, {
      input: { redaction: { custom: bombs.map((pattern, i) => ({ name: `bomb${i}`, pattern })) } },
    });
    expect(saved.errors).toBeUndefined();
    const rules = { ...DEFAULT_REDACTION, custom: bombs.map((pattern, i) => ({ name: `b${i}`, pattern, flags: "", placeholder: "[B]" })) };
    const texts = ["a".repeat(5_000) + "!", "word ".repeat(1_000) + "!", "x".repeat(5_000)];
    const result = await redactTexts(rules, texts);
    expect(result.texts).toHaveLength(3);
    await engram.gql(UPDATE, { input: { redaction: { custom: [] } } });

    // What RE2 cannot run in linear time is refused when saved.
    for (const pattern of ["(a)\\1", "(?=a)b", "(?<!a)b"]) {
      const refused = await engram.gql(UPDATE, { input: { redaction: { custom: [{ name: "refused", pattern }] } } });
      expect(refused.errors?.[0].extensions?.code, pattern).toBe("BAD_USER_INPUT");
      expect(refused.errors?.[0].message).toMatch(/RE2/);
    }

    // The run-time limit stays: past it, the work is cut off and fails closed.
    const strict = new CustomPatternPool({ workers: 1, timeoutMs: 1, msPerThousandChars: 0 });
    try {
      await expect(redactTexts(rules, ["word ".repeat(100_000)], { pool: strict })).rejects.toMatchObject({ code: "REDACTION_FAILED" });
    } finally {
      await strict.close();
    }
  });

  it("one tenant's redaction work cannot starve another's: tenants are served in turn", async () => {
    const pool = new CustomPatternPool({ workers: 1 });
    const rules = { ...DEFAULT_REDACTION, custom: [{ name: "w", pattern: "(\\w+\\s?){20}$", flags: "", placeholder: "[W]" }] };
    const finished: string[] = [];
    try {
      const flood = Array.from({ length: 6 }, (_, i) =>
        redactTexts(rules, ["word ".repeat(2_000)], { tenant: "a", pool }).then(() => finished.push(`a${i}`)),
      );
      const other = redactTexts(rules, ["one small text"], { tenant: "b", pool }).then(() => finished.push("b"));
      await Promise.all([...flood, other]);
    } finally {
      await pool.close();
    }
    // With one shared queue b would finish last; in turn, it runs right after a's next job.
    expect(finished.indexOf("b")).toBeLessThanOrEqual(2);
  });

  it("a pattern planted in the store that cannot run fails the model call closed", async () => {
    const hostile = { ...DEFAULT_REDACTION, custom: [{ name: "evil", pattern: "(a)\\1", flags: "", placeholder: "[EVIL]" }] };
    // Planted straight into the store (bypassing validation), it fails the model call closed:
    // nothing is sent and nothing is marked.
    await engram.services.db.tenantSettings.update({
      where: { tenantId: engram.tenant.tenantId },
      data: { redaction: { custom: hostile.custom } },
    });
    settingsChanged(engram.tenant.tenantId); // written past updateTenantSettings
    await appendOld(engram, engram.tenant.writer, "hostile", ["a".repeat(30) + "!", "b", "c"]);
    const from = serverA.requests.length;
    const { done: [run] } = await compactTenants(engram.services.deps, { tenantId: engram.tenant.tenantId });
    expect(run.status).toBe("FAILED");
    expect(JSON.stringify(run.result)).toMatch(/custom redaction pattern failed/);
    expect(serverA.requests.length).toBe(from);
    expect(await engram.services.db.memoryEvent.count({ where: { scopeRef: "hostile", compressedAt: { not: null } } })).toBe(0);
    await engram.services.db.tenantSettings.update({
      where: { tenantId: engram.tenant.tenantId },
      data: { redaction: {} },
    });
    settingsChanged(engram.tenant.tenantId); // written past updateTenantSettings
    const { done: [retry] } = await compactTenants(engram.services.deps, { tenantId: engram.tenant.tenantId });
    expect(retry.status).toBe("SUCCEEDED");
  });

  it("pauses compaction when the budget is spent, marks nothing, and resumes when it is raised", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const spent = (await budgetStatus(db, null)).spent;
    await engram.gql(UPDATE, { input: { monthlyTokenBudget: spent } });
    const status = await engram.gql(BUDGET);
    expect(status.data.budgetStatus).toMatchObject({ spent, limit: spent, paused: true });
    expect(status.data.budgetStatus.pausedSince).not.toBeNull();

    await appendOld(engram, engram.tenant.writer, "paused", ["one", "two", "three"]);
    const from = serverA.requests.length;
    await expect(compactTenantsUntilDone(engram.services.deps, { tenantId: engram.tenant.tenantId })).rejects.toMatchObject({
      code: "BUDGET_EXHAUSTED",
    });
    expect(serverA.requests.length).toBe(from);
    expect(await engram.services.db.memoryEvent.count({ where: { scopeRef: "paused", compressedAt: { not: null } } })).toBe(0);
    const [run] = (await engram.gql(`{ jobRuns(name: "memory.compact", first: 1) { status result } }`)).data.jobRuns;
    expect(run).toMatchObject({ status: "SKIPPED", result: { paused: true } });

    await engram.gql(UPDATE, { input: { monthlyTokenBudget: spent + 1_000_000 } });
    await compactTenantsUntilDone(engram.services.deps, { tenantId: engram.tenant.tenantId });
    expect(await engram.services.db.memoryEvent.count({ where: { scopeRef: "paused", compressedAt: { not: null } } })).toBe(3);
    const after = await engram.gql(BUDGET);
    expect(after.data.budgetStatus).toMatchObject({ paused: false, pausedSince: null, limit: spent + 1_000_000 });
    await engram.gql(UPDATE, { input: { monthlyTokenBudget: null } });
  });

  it("counts the budget per calendar month (UTC): last month's usage does not pause this month", async () => {
    const db = forTenant(engram.services.db, engram.other.tenantId);
    const now = new Date();
    const lastMonth = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1) - DAY_MS);
    await engram.services.db.modelUsage.create({
      data: { tenantId: engram.other.tenantId, purpose: "memory:x", chain: "summary", model: "x", inputTokens: 900_000, outputTokens: 0, createdAt: lastMonth },
    });
    await engram.gql(UPDATE, { input: { monthlyTokenBudget: 500_000 } }, engram.other.admin);
    const status = await budgetStatus(db, null, now);
    expect(status.paused).toBe(false);
    expect(status.periodStart.toISOString()).toBe(new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1)).toISOString());
    // Seen from last month, the same usage had spent it.
    expect((await budgetStatus(db, null, lastMonth)).paused).toBe(true);
    await engram.gql(UPDATE, { input: { monthlyTokenBudget: null } }, engram.other.admin);
  });

  it("shows cost per model, day, purpose and tenant from the price table, for the caller's tenant only", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    await db.modelUsage.deleteMany({});
    await recordModelUsage(db, { chain: "summary", model: "cheap-m", inputTokens: 2_000_000, outputTokens: 500_000 });
    await recordModelUsage(db, { chain: "loss-judge", model: "cheap-m", inputTokens: 1_000_000, outputTokens: 0 });
    await recordModelUsage(db, { chain: "compactor", model: "unpriced-m", inputTokens: 300, outputTokens: 100 });
    await recordModelUsage(forTenant(engram.services.db, engram.other.tenantId), { chain: "summary", model: "cheap-m", inputTokens: 7, outputTokens: 7 });
    const { errors } = await engram.gql(UPDATE, {
      input: { prices: [{ model: "cheap-m", inputPerMillion: 0.15, outputPerMillion: 0.6 }] },
    });
    expect(errors).toBeUndefined();
    const today = new Date().toISOString().slice(0, 10);
    const byModelAndDay = await engram.gql(
      `{ modelUsage(groupBy: [MODEL, DAY]) { costUsd unpricedTokens inputTokens rows { model day purpose chain calls inputTokens outputTokens costUsd unpricedTokens } } }`,
    );
    expect(byModelAndDay.errors).toBeUndefined();
    const report = byModelAndDay.data.modelUsage;
    expect(report.rows).toEqual([
      { model: "cheap-m", day: today, purpose: null, chain: null, calls: 2, inputTokens: 3_000_000, outputTokens: 500_000, costUsd: 0.75, unpricedTokens: 0 },
      { model: "unpriced-m", day: today, purpose: null, chain: null, calls: 1, inputTokens: 300, outputTokens: 100, costUsd: null, unpricedTokens: 400 },
    ]);
    expect(report.costUsd).toBeCloseTo(0.75);
    expect(report.unpricedTokens).toBe(400);
    expect(report.inputTokens).toBe(3_000_300);

    const byTenant = await engram.gql(`{ modelUsage(groupBy: [TENANT]) { rows { tenantId calls costUsd } } }`);
    expect(byTenant.data.modelUsage.rows).toEqual([{ tenantId: engram.tenant.tenantId, calls: 3, costUsd: 0.75 }]);
    const byPurpose = await engram.gql(`{ modelUsage(groupBy: [PURPOSE]) { rows { purpose calls } } }`, {}, engram.tenant.reader);
    expect(byPurpose.data.modelUsage.rows).toEqual([
      { purpose: "memory:cheap-m", calls: 2 },
      { purpose: "memory:unpriced-m", calls: 1 },
    ]);
    const tomorrow = new Date(Date.now() + DAY_MS).toISOString();
    const empty = await engram.gql(`query($from: DateTime) { modelUsage(from: $from) { calls rows { calls } } }`, { from: tomorrow });
    expect(empty.data.modelUsage).toEqual({ calls: 0, rows: [] });
  });

  it("prices models named like an object's own properties as any other", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    await db.modelUsage.deleteMany({});
    for (const model of ["constructor", "__proto__", "toString"]) {
      await recordModelUsage(db, { chain: "summary", model, inputTokens: 1_000_000, outputTokens: 0 });
    }
    // The one name a JSON object cannot hold as a key is refused, not dropped without a word.
    const refused = await engram.gql(UPDATE, { input: { prices: [{ model: "__proto__", inputPerMillion: 2, outputPerMillion: 2 }] } });
    expect(refused.errors?.[0]?.extensions?.code).toBe("BAD_USER_INPUT");
    const { errors } = await engram.gql(UPDATE, {
      input: { prices: [{ model: "constructor", inputPerMillion: 2, outputPerMillion: 2 }, { model: "toString", inputPerMillion: 1, outputPerMillion: 1 }] },
    });
    expect(errors).toBeUndefined();
    const { data, errors: usageErrors } = await engram.gql(`{ modelUsage(groupBy: [MODEL]) { costUsd unpricedTokens rows { model costUsd unpricedTokens } } }`);
    expect(usageErrors).toBeUndefined();
    expect(data.modelUsage.rows).toEqual([
      { model: "__proto__", costUsd: null, unpricedTokens: 1_000_000 },
      { model: "constructor", costUsd: 2, unpricedTokens: 0 },
      { model: "toString", costUsd: 1, unpricedTokens: 0 },
    ]);
    expect(data.modelUsage).toMatchObject({ costUsd: 3, unpricedTokens: 1_000_000 });
    await db.modelUsage.deleteMany({});
  });

  it("runs a tenant's compaction on its own schedule", async () => {
    const now = new Date();
    await engram.gql(UPDATE, { input: { compaction: { schedule: "0 * * * *" } } }, engram.other.admin);
    // Both tenants ran compaction moments ago: nothing is due until their schedules come round.
    expect((await compactTenants(engram.services.deps, { due: true }, now)).done).toEqual([]);
    // In an hour and a bit, the hourly tenant is due and the daily one (06:17 UTC) may not be.
    const later = new Date(now.getTime() + 65 * 60_000);
    const { done: runs } = await compactTenants(engram.services.deps, { due: true }, later);
    expect(runs.map((r) => r.tenantId)).toContain(engram.other.tenantId);
    const crossed617 = Math.floor((later.getTime() - 6 * 3_600_000 - 17 * 60_000) / DAY_MS) > Math.floor((now.getTime() - 6 * 3_600_000 - 17 * 60_000) / DAY_MS);
    expect(runs.some((r) => r.tenantId === engram.tenant.tenantId)).toBe(crossed617);
  });

  it("tries a failed compaction again before the schedule's next occurrence, less often each time", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const now = Date.now();
    const at = (minutes: number) => new Date(now + minutes * 60_000);
    // Once a day, an hour from now; the runs below are dated after that occurrence.
    const occurrence = at(60);
    await engram.gql(UPDATE, { input: { compaction: { schedule: `${occurrence.getUTCMinutes()} ${occurrence.getUTCHours()} * * *` } } });
    const failed = (minutes: number, ended = minutes) =>
      db.jobRun.create({ data: { tenantId: engram.tenant.tenantId, name: "memory.compact", status: "FAILED", startedAt: at(minutes), finishedAt: at(ended) } });
    const due = async (minutes: number) =>
      (await compactTenants(engram.services.deps, { due: true }, at(minutes))).done.some((r) => r.tenantId === engram.tenant.tenantId);
    try {
      await failed(61);
      expect(await due(70)).toBe(false);
      // A run under way blocks the retry.
      const running = await db.jobRun.create({ data: { tenantId: engram.tenant.tenantId, name: "memory.compact", status: "RUNNING", startedAt: at(75), heartbeatAt: at(76) } });
      expect(await due(77)).toBe(false);
      await db.jobRun.delete({ where: { id: running.id } });
      expect(await due(77)).toBe(true);
      // A second failure waits 30 minutes, not 15, from when it ended.
      await failed(80, 90);
      expect(await due(111)).toBe(false);
      expect(await due(121)).toBe(true);
      // After four retries, the next occurrence.
      for (const minutes of [130, 150, 200]) await failed(minutes);
      expect(await due(600)).toBe(false);
      expect(await due(60 + 24 * 60 + 1)).toBe(true);
      // A run whose process died (no sign of life for 5 minutes) is closed as FAILED by the sweep, and retried.
      await db.jobRun.deleteMany({ where: { name: "memory.compact" } });
      const dead = await db.jobRun.create({ data: { tenantId: engram.tenant.tenantId, name: "memory.compact", status: "RUNNING", startedAt: at(61), heartbeatAt: at(62) } });
      expect(await due(80)).toBe(false);
      expect(await db.jobRun.findUniqueOrThrow({ where: { id: dead.id } })).toMatchObject({ status: "FAILED" });
      expect(await due(96)).toBe(true);
    } finally {
      await db.jobRun.deleteMany({ where: { name: "memory.compact" } });
      await engram.gql(UPDATE, { input: { compaction: { schedule: "17 6 * * *" } } });
    }
  });
});

describe("settings on a server without ENGRAM_SECRET", () => {
  let engram: TestEngram;
  beforeAll(async () => {
    engram = await startTestEngram({ env: { ENGRAM_EMBEDDINGS: "offline", ENGRAM_MODEL_HOST_ALLOWLIST: "127.0.0.1:9" } });
  });
  afterAll(() => engram?.stop());

  it("names no model for a role whose calls are off, and the offline encoder for recall embeddings", async () => {
    const EFFECTIVE = `{ tenantSettings { modelRouting { cheap { effectiveModel } compaction { effectiveModel } embedding { effectiveModel } } } }`;
    // No OPENAI_API_KEY or OPENAI_BASE_URL on this server and no tenant route: nothing is called.
    const { data, errors } = await engram.gql(EFFECTIVE);
    expect(errors).toBeUndefined();
    expect(data.tenantSettings.modelRouting).toEqual({
      cheap: { effectiveModel: null },
      compaction: { effectiveModel: null },
      embedding: { effectiveModel: "use-lite-512" },
    });
    expect(await engram.services.models.chat(engram.tenant.tenantId, "cheap", "summary")).toBeNull();
    // A route of the tenant's own turns the role on, with the server's default model name.
    const routed = await engram.gql(UPDATE, { input: { modelRouting: { compaction: { baseUrl: "http://127.0.0.1:9/v1" } } } }, engram.other.admin);
    expect(routed.errors).toBeUndefined();
    expect((await engram.gql(EFFECTIVE, {}, engram.other.admin)).data.tenantSettings.modelRouting.compaction).toEqual({ effectiveModel: "gpt-4o" });
    // Recall always embeds: OpenAI embeddings forced with no route to call fall back to the offline encoder, and say so.
    expect(effectiveModelName(readEnv({ ENGRAM_EMBEDDINGS: "openai" }), "embedding", undefined)).toBe("use-lite-512");
    expect(effectiveModelName(readEnv({ ENGRAM_EMBEDDINGS: "openai", OPENAI_API_KEY: "sk-x" }), "embedding", undefined)).toBe("text-embedding-3-small");
  });

  it("refuses a tenant API key with a clear BAD_USER_INPUT and writes nothing", async () => {
    const { errors } = await engram.gql(UPDATE, {
      input: { retentionDays: 7, modelRouting: { cheap: { baseUrl: "http://127.0.0.1:9/v1", apiKey: "sk-should-not-be-stored-000000" } } },
    });
    expect(errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    expect(errors?.[0].message).toMatch(/ENGRAM_SECRET/);
    const { data } = await engram.gql(SETTINGS);
    expect(data.tenantSettings.retentionDays).toBe(180);
    expect(data.tenantSettings.modelRouting.cheap.hasApiKey).toBe(false);
    expect(await engram.services.db.auditLog.count({ where: { tenantId: engram.tenant.tenantId, action: "settings.update" } })).toBe(0);
    // Without a key, a route is fine, and the server's own key is not sent to it.
    const routed = await engram.gql(UPDATE, { input: { modelRouting: { cheap: { baseUrl: "http://127.0.0.1:9/v1" } } } });
    expect(routed.errors).toBeUndefined();
    expect(await engram.services.models.route(engram.tenant.tenantId, "cheap")).toEqual({
      baseUrl: "http://127.0.0.1:9/v1",
      model: "gpt-4o-mini",
      apiKey: undefined,
    });
  });
});

describe("budget pause and resume of queued summary work", () => {
  let engram: TestEngram;
  let model: ModelServer;
  beforeAll(async () => {
    ({ model, engram } = await startEngramWithModel({
      worker: true,
      apiKey: "k",
      respond: memoryScript(),
      env: { ENGRAM_EMBEDDINGS: "offline" },
    }));
  });
  afterAll(async () => {
    await engram?.stop();
    await model?.stop();
  });

  it("queues summary rewrites while the budget is spent, then completes them when it is raised", async () => {
    const set = await engram.gql(UPDATE, { input: { monthlyTokenBudget: 0 } });
    expect(set.errors).toBeUndefined();
    let conversationId = "";
    for (let n = 1; n <= 8; n++) {
      const turn = await recordTurn(engram, {
        agentExternalId: "concierge",
        endUserExternalId: "guest",
        conversationExternalId: "budgeted",
        userMessage: `Question ${n} about the trip`,
        assistantMessage: `Answer ${n} about the trip`,
      });
      conversationId = turn.conversation.id;
    }
    // Context assembly keeps answering while paused.
    const context = await engram.gql(`query($input: ContextInput!) { context(input: $input) { blocks { kind } } }`, {
      input: { conversationId, message: "and now?" },
    });
    expect(context.errors).toBeUndefined();

    await new Promise((resolve) => setTimeout(resolve, 4_000));
    expect(model.requests).toEqual([]);
    expect(await engram.services.db.summaryRevision.count()).toBe(0);
    const paused = await engram.gql(BUDGET);
    expect(paused.data.budgetStatus).toMatchObject({ spent: 0, limit: 0, paused: true });

    await engram.gql(UPDATE, { input: { monthlyTokenBudget: 10_000_000 } });
    await until(
      "the queued rewrite to run",
      async () => (await engram.services.db.conversation.findUniqueOrThrow({ where: { id: conversationId } })).summaryThroughSeq === 10,
      60_000,
    );
    const resumed = await engram.gql(BUDGET);
    expect(resumed.data.budgetStatus.paused).toBe(false);
    expect(resumed.data.budgetStatus.spent).toBeGreaterThan(0);
  });
});

describe("the operator's ceiling on a tenant's month (ENGRAM_MONTHLY_TOKEN_BUDGET)", () => {
  // A tenant's admin sets its own budget, and may route calls on the server's key: the operator
  // needs a limit no tenant setting lifts.
  let engram: TestEngram;
  let model: ModelServer;
  beforeAll(async () => {
    ({ model, engram } = await startEngramWithModel({ apiKey: "k", respond: () => "{}", env: { ENGRAM_MONTHLY_TOKEN_BUDGET: "1000" } }));
  });
  afterAll(async () => {
    await engram?.stop();
    await model?.stop();
  });

  it("holds a tenant with no budget, or a larger one, to the ceiling, and a lower budget to itself", async () => {
    const limit = async (monthlyTokenBudget: number | null) => {
      const set = await engram.gql(UPDATE, { input: { monthlyTokenBudget } });
      expect(set.errors).toBeUndefined();
      expect(set.data.updateTenantSettings.monthlyTokenBudget).toBe(monthlyTokenBudget); // the tenant's own, as set
      return (await engram.gql(BUDGET)).data.budgetStatus.limit;
    };
    expect(await limit(null)).toBe(1000);
    expect(await limit(5_000_000)).toBe(1000);
    expect(await limit(400)).toBe(400);
    expect(await limit(null)).toBe(1000);
  });

  it("refuses a tenant's calls once the ceiling is spent, before anything is sent", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const chat = await engram.services.models.chat(engram.tenant.tenantId, "cheap", "summary");
    expect(await chat!.invoke("hello")).toBeDefined();
    await recordModelUsage(db, { chain: "summary", model: "cheap-m", inputTokens: 1_000, outputTokens: 0 });
    const status = (await engram.gql(BUDGET)).data.budgetStatus;
    expect(status).toMatchObject({ limit: 1000, paused: true });
    const sent = model.requests.length;
    await expect(chat!.invoke("hello again")).rejects.toMatchObject({ code: "BUDGET_EXHAUSTED" });
    expect(model.requests.length).toBe(sent);
    expect(await engram.services.models.budgetSpent(engram.tenant.tenantId)).toBe(true);
    // The other tenant spent nothing: the ceiling is each tenant's own.
    expect(await engram.services.models.budgetSpent(engram.other.tenantId)).toBe(false);
  });
});
