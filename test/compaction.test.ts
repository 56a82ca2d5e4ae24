import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compactTenants } from "../src/work/compact-tenants.ts";
import { startEngramWithModel, startTestEngram, type TestEngram } from "./helpers/engram.ts";
import type { ChatRequest, ModelServer } from "./helpers/model-server.ts";

const DAY_MS = 86_400_000;
const daysAgo = (days: number) => new Date(Date.now() - days * DAY_MS).toISOString();

const APPEND = /* GraphQL */ `
  mutation Append($input: AppendEventInput!) { appendEvent(input: $input) { id } }
`;

const EVENTS = /* GraphQL */ `
  query Events($scope: Scope, $scopeRef: String, $includeCompressed: Boolean) {
    events(scope: $scope, scopeRef: $scopeRef, includeCompressed: $includeCompressed, first: 100) {
      edges { node { id body occurredAt compressedAt entry { id } } }
    }
  }
`;

const ENTRIES = /* GraphQL */ `
  query Entries($scope: Scope, $scopeRef: String) {
    entries(scope: $scope, scopeRef: $scopeRef, first: 5) {
      edges { node { id scope scopeRef title summary tags importance source events(first: 10) { edges { node { id } } } } }
    }
  }
`;

const JOB_RUNS = /* GraphQL */ `
  query { jobRuns(name: "memory.compact", first: 50) { id name status result error startedAt finishedAt } }
`;

type Scope = "INSTITUTIONAL" | "ENTITY" | "PROJECT" | "TEAM";

/** The "Scope: X ref" line the compactor sends, so the script can answer per bucket. */
function bucketOf(request: ChatRequest): string {
  const human = request.messages.find((m) => m.role === "user")?.content ?? "";
  return /^Scope: (\S+ \S+)/.exec(human)?.[1] ?? "?";
}

const answerFor = (bucket: string) =>
  JSON.stringify({
    title: `Digest of ${bucket}`,
    summary: `- Every decision of ${bucket}, kept.`,
    tags: ["Compacted", bucket.split(" ")[1]],
  });

async function append(
  engram: TestEngram,
  key: string,
  scope: Scope,
  scopeRef: string,
  ages: number[],
  body = `${scope} ${scopeRef} moment`,
) {
  const ids: string[] = [];
  for (const [i, age] of ages.entries()) {
    const { data, errors } = await engram.gql(
      APPEND,
      { input: { scope, scopeRef, kind: "call_summary", body: `${body} #${i}`, source: "test", occurredAt: daysAgo(age) } },
      key,
    );
    expect(errors).toBeUndefined();
    ids.push(data.appendEvent.id);
  }
  return ids;
}

async function events(engram: TestEngram, scope: Scope, scopeRef: string, includeCompressed: boolean, key?: string) {
  const { data, errors } = await engram.gql(EVENTS, { scope, scopeRef, includeCompressed }, key);
  expect(errors).toBeUndefined();
  return data.events.edges.map((e: any) => e.node) as {
    id: string;
    body: string;
    compressedAt: string | null;
    entry: { id: string } | null;
  }[];
}

async function entries(engram: TestEngram, scope: Scope, scopeRef: string, key?: string) {
  const { data, errors } = await engram.gql(ENTRIES, { scope, scopeRef }, key);
  expect(errors).toBeUndefined();
  return data.entries.edges.map((e: any) => e.node) as any[];
}

async function runsOf(engram: TestEngram, key?: string) {
  const { data, errors } = await engram.gql(JOB_RUNS, {}, key);
  expect(errors).toBeUndefined();
  return data.jobRuns as any[];
}

describe("daily compaction against an OpenAI-compatible model", () => {
  let engram: TestEngram;
  let server: ModelServer;

  beforeAll(async () => {
    ({ model: server, engram } = await startEngramWithModel({
      apiKey: "test",
      respond: (request) => answerFor(bucketOf(request)),
    }));
  });
  afterAll(async () => {
    await engram?.stop();
    await server?.stop();
  });

  it("folds each bucket of 3+ events older than 90 days into one compactor entry, keeping the events", async () => {
    const { writer } = engram.tenant;
    const launch = await append(engram, writer, "PROJECT", "launch-q3", [200, 150, 120, 95]);
    const acmeOld = await append(engram, writer, "ENTITY", "acme", [300, 180, 91]);
    const acmeNew = await append(engram, writer, "ENTITY", "acme", [10]);
    const growth = await append(engram, writer, "TEAM", "growth", [400, 200]); // too few
    const recent = await append(engram, writer, "INSTITUTIONAL", "org", [80, 60, 30, 5]); // too recent
    // The other tenant has its own old bucket under the same scope pair.
    const otherLaunch = await append(engram, engram.other.writer, "PROJECT", "launch-q3", [120, 110, 100], "tenant-b secret");

    const { done: runs } = await compactTenants(engram.services.deps, {});
    expect(runs.map((r) => r.status)).toEqual(["SUCCEEDED", "SUCCEEDED"]);

    // One model call per eligible bucket, each for the right events, oldest first.
    expect(server.requests.map(bucketOf).sort()).toEqual(["ENTITY acme", "PROJECT launch-q3", "PROJECT launch-q3"]);
    const acmeRequest = server.requests.find((r) => bucketOf(r) === "ENTITY acme")!;
    expect(acmeRequest.model).toBe("gpt-4o");
    const acmeHuman = acmeRequest.messages.find((m) => m.role === "user")!.content;
    expect(acmeHuman).toContain("Events, oldest first (3):");
    expect(acmeHuman.indexOf("#0")).toBeLessThan(acmeHuman.indexOf("#2"));
    expect(acmeHuman).not.toContain("#3");
    const tenantARequest = server.requests.find((r) => bucketOf(r) === "PROJECT launch-q3" && !JSON.stringify(r).includes("tenant-b"))!;
    expect(tenantARequest.messages.find((m) => m.role === "user")!.content).toContain("Events, oldest first (4):");

    // A new entry per eligible bucket, written by the compactor from the model's answer.
    const [launchEntry] = await entries(engram, "PROJECT", "launch-q3");
    expect(launchEntry).toMatchObject({
      title: "Digest of PROJECT launch-q3",
      summary: "- Every decision of PROJECT launch-q3, kept.",
      tags: ["compacted", "launch-q3"],
      importance: 4,
      source: "COMPACTOR",
    });
    expect(launchEntry.events.edges.map((e: any) => e.node.id).sort()).toEqual([...launch].sort());
    const acmeEntries = await entries(engram, "ENTITY", "acme");
    expect(acmeEntries).toHaveLength(1);
    expect(acmeEntries[0]).toMatchObject({ title: "Digest of ENTITY acme", importance: 4, source: "COMPACTOR" });
    expect(await entries(engram, "TEAM", "growth")).toEqual([]);
    expect(await entries(engram, "INSTITUTIONAL", "org")).toEqual([]);

    // Events are kept, marked and linked; the default listing hides compressed ones.
    const launchAll = await events(engram, "PROJECT", "launch-q3", true);
    expect(launchAll).toHaveLength(4);
    for (const e of launchAll) {
      expect(e.compressedAt).not.toBeNull();
      expect(e.entry?.id).toBe(launchEntry.id);
    }
    expect(await events(engram, "PROJECT", "launch-q3", false)).toEqual([]);
    const acmeVisible = await events(engram, "ENTITY", "acme", false);
    expect(acmeVisible.map((e) => e.id)).toEqual(acmeNew);
    expect(acmeVisible[0].compressedAt).toBeNull();
    const acmeAll = await events(engram, "ENTITY", "acme", true);
    expect(acmeAll.filter((e) => e.entry?.id === acmeEntries[0].id).map((e) => e.id).sort()).toEqual([...acmeOld].sort());
    for (const [scope, ref, ids] of [["TEAM", "growth", growth], ["INSTITUTIONAL", "org", recent]] as const) {
      const untouched = await events(engram, scope, ref, false);
      expect(untouched.map((e) => e.id).sort()).toEqual([...ids].sort());
    }
    expect(await engram.services.db.memoryEvent.count()).toBe(4 + 4 + 2 + 4 + 3);

    // Tenants stay apart: each sees only its own entry and events.
    const otherEntries = await entries(engram, "PROJECT", "launch-q3", engram.other.reader);
    expect(otherEntries).toHaveLength(1);
    expect(otherEntries[0].id).not.toBe(launchEntry.id);
    expect(otherEntries[0].events.edges.map((e: any) => e.node.id).sort()).toEqual([...otherLaunch].sort());
    expect(launchAll.some((e) => e.body.includes("tenant-b"))).toBe(false);

    // The run is visible with its result, per tenant.
    const [run] = await runsOf(engram, engram.tenant.reader);
    expect(run).toMatchObject({ name: "memory.compact", status: "SUCCEEDED", error: null });
    expect(run.finishedAt).not.toBeNull();
    expect(run.result).toMatchObject({ buckets: 2, compacted: 2, failed: 0, eventsCompressed: 7, errors: [] });
    expect([...run.result.entryIds].sort()).toEqual([launchEntry.id, acmeEntries[0].id].sort());
    const [otherRun] = await runsOf(engram, engram.other.reader);
    expect(otherRun.result).toMatchObject({ buckets: 1, compacted: 1, eventsCompressed: 3 });

    // Tokens are accounted per tenant under memory:<model>, as the provider reported them.
    const tenantRequests = server.requests.filter((r) => !JSON.stringify(r).includes("tenant-b"));
    const promptTokens = tenantRequests.reduce(
      (n, r) => n + r.messages.reduce((m, msg) => m + Math.ceil(msg.content.length / 4), 0),
      0,
    );
    const completionTokens = tenantRequests.reduce((n, r) => n + Math.ceil(answerFor(bucketOf(r)).length / 4), 0);
    const usage = await engram.gql(
      `{ modelUsage { inputTokens outputTokens rows { purpose chain model calls inputTokens outputTokens } } }`,
      {},
      engram.tenant.reader,
    );
    expect(usage.errors).toBeUndefined();
    expect(usage.data.modelUsage).toEqual({
      inputTokens: promptTokens,
      outputTokens: completionTokens,
      rows: [
        { purpose: "memory:gpt-4o", chain: "compactor", model: "gpt-4o", calls: 2, inputTokens: promptTokens, outputTokens: completionTokens },
      ],
    });

    // Nothing is left to do: a second run calls no model and creates nothing.
    const callsBefore = server.requests.length;
    const { done: again } = await compactTenants(engram.services.deps, {});
    expect(again.map((r) => r.result)).toEqual([
      expect.objectContaining({ buckets: 0, compacted: 0 }),
      expect.objectContaining({ buckets: 0, compacted: 0 }),
    ]);
    expect(server.requests.length).toBe(callsBefore);
    expect(await engram.services.db.memoryEntry.count()).toBe(3);
  });

  it("leaves a bucket whose model call fails untouched, compacts the others, and retries it next run", async () => {
    const { writer } = engram.tenant;
    const failing = await append(engram, writer, "PROJECT", "outage", [150, 140, 130]);
    await append(engram, writer, "PROJECT", "steady", [150, 140, 130]);
    server.respond((request) =>
      bucketOf(request) === "PROJECT outage" ? { status: 500, message: "model is down" } : answerFor(bucketOf(request)),
    );
    const calls = server.requests.length;

    const { done: [run] } = await compactTenants(engram.services.deps, { tenantId: engram.tenant.tenantId });
    expect(run.status).toBe("FAILED");
    expect(run.result).toMatchObject({ buckets: 2, compacted: 1, failed: 1, eventsCompressed: 3 });
    expect((run.result as any).errors).toEqual([
      expect.objectContaining({ scope: "PROJECT", scopeRef: "outage", error: expect.any(String) }),
    ]);
    // With retries off, the failing bucket was asked exactly once.
    expect(server.requests.slice(calls).map(bucketOf).sort()).toEqual(["PROJECT outage", "PROJECT steady"]);

    expect(await entries(engram, "PROJECT", "outage")).toEqual([]);
    const stillThere = await events(engram, "PROJECT", "outage", false);
    expect(stillThere.map((e) => e.id).sort()).toEqual([...failing].sort());
    expect(stillThere.every((e) => e.compressedAt === null && e.entry === null)).toBe(true);
    expect(await entries(engram, "PROJECT", "steady")).toHaveLength(1);
    expect(await events(engram, "PROJECT", "steady", false)).toEqual([]);

    const [failedRun] = await runsOf(engram);
    expect(failedRun).toMatchObject({ id: run.id, status: "FAILED" });
    expect(failedRun.result.errors[0].scopeRef).toBe("outage");

    // The model is back: the next run picks the failed bucket up, and only it.
    server.respond((request) => answerFor(bucketOf(request)));
    const callsBeforeRetry = server.requests.length;
    const { done: [retry] } = await compactTenants(engram.services.deps, { tenantId: engram.tenant.tenantId });
    expect(retry.status).toBe("SUCCEEDED");
    expect(retry.result).toMatchObject({ buckets: 1, compacted: 1, failed: 0, eventsCompressed: 3 });
    expect(server.requests.slice(callsBeforeRetry).map(bucketOf)).toEqual(["PROJECT outage"]);
    const [outageEntry] = await entries(engram, "PROJECT", "outage");
    expect(outageEntry).toMatchObject({ title: "Digest of PROJECT outage", source: "COMPACTOR" });
    const marked = await events(engram, "PROJECT", "outage", true);
    expect(marked.every((e) => e.compressedAt !== null && e.entry?.id === outageEntry.id)).toBe(true);
  });

  it("commits the entry and the marking together: a failed marking leaves no entry", async () => {
    const { db } = engram.services;
    const ids = await append(engram, engram.tenant.writer, "TEAM", "atomic", [200, 190, 180]);
    await db.$executeRawUnsafe(`
      CREATE OR REPLACE FUNCTION engram_test_refuse_compression() RETURNS trigger AS $$
      BEGIN
        IF NEW."compressedAt" IS NOT NULL AND OLD."compressedAt" IS NULL THEN
          RAISE EXCEPTION 'test trigger refuses to mark events compressed';
        END IF;
        RETURN NEW;
      END;
      $$ LANGUAGE plpgsql`);
    await db.$executeRawUnsafe(`
      CREATE TRIGGER engram_test_refuse_compression BEFORE UPDATE ON "MemoryEvent"
      FOR EACH ROW EXECUTE FUNCTION engram_test_refuse_compression()`);
    const entriesBefore = await db.memoryEntry.count();
    const calls = server.requests.length;

    try {
      const { done: [run] } = await compactTenants(engram.services.deps, { tenantId: engram.tenant.tenantId });
      expect(run.status).toBe("FAILED");
      expect(run.result).toMatchObject({ buckets: 1, compacted: 0, failed: 1, eventsCompressed: 0, entryIds: [] });
      // The database's own words go to the log, not into the run that readers see.
      expect((run.result as any).errors[0].error).toBe("failed unexpectedly (the server's log has the error)");
      // The model did answer: it is the insert that was rolled back with the marking.
      expect(server.requests.slice(calls).map(bucketOf)).toEqual(["TEAM atomic"]);
      expect(await db.memoryEntry.count()).toBe(entriesBefore);
      expect(await entries(engram, "TEAM", "atomic")).toEqual([]);
      const unmarked = await events(engram, "TEAM", "atomic", false);
      expect(unmarked.map((e) => e.id).sort()).toEqual([...ids].sort());
      expect(unmarked.every((e) => e.compressedAt === null && e.entry === null)).toBe(true);
    } finally {
      await db.$executeRawUnsafe(`DROP TRIGGER IF EXISTS engram_test_refuse_compression ON "MemoryEvent"`);
      await db.$executeRawUnsafe(`DROP FUNCTION IF EXISTS engram_test_refuse_compression()`);
    }

    const { done: [rerun] } = await compactTenants(engram.services.deps, { tenantId: engram.tenant.tenantId });
    expect(rerun.status).toBe("SUCCEEDED");
    expect(rerun.result).toMatchObject({ buckets: 1, compacted: 1, eventsCompressed: 3 });
    const [entry] = await entries(engram, "TEAM", "atomic");
    expect(entry).toMatchObject({ title: "Digest of TEAM atomic", importance: 4, source: "COMPACTOR" });
    const marked = await events(engram, "TEAM", "atomic", true);
    expect(marked.map((e) => e.id).sort()).toEqual([...ids].sort());
    expect(marked.every((e) => e.compressedAt !== null && e.entry?.id === entry.id)).toBe(true);
  });
});

describe("daily compaction without a model", () => {
  let engram: TestEngram;
  beforeAll(async () => {
    engram = await startTestEngram();
  });
  afterAll(() => engram?.stop());

  it("is skipped with the reason and touches nothing", async () => {
    const ids = await append(engram, engram.tenant.writer, "PROJECT", "launch-q3", [200, 150, 120]);
    const { done: runs } = await compactTenants(engram.services.deps, {});
    expect(runs.map((r) => r.status)).toEqual(["SKIPPED", "SKIPPED"]);

    const [run] = await runsOf(engram, engram.tenant.reader);
    expect(run).toMatchObject({ name: "memory.compact", status: "SKIPPED", error: null });
    expect(run.result.reason).toMatch(/no model configured/);
    expect(await engram.services.db.memoryEntry.count()).toBe(0);
    expect(await engram.services.db.modelUsage.count()).toBe(0);
    const untouched = await events(engram, "PROJECT", "launch-q3", false);
    expect(untouched.map((e) => e.id).sort()).toEqual([...ids].sort());
    expect(untouched.every((e) => e.compressedAt === null)).toBe(true);
  });
});

describe("the job worker", () => {
  let engram: TestEngram;
  beforeAll(async () => {
    engram = await startTestEngram({ worker: true });
  });
  afterAll(() => engram?.stop());

  it("sweeps every minute for tenants whose compaction schedule (default 06:17 UTC) has come round", async () => {
    const jobs = await engram.services.db.$queryRawUnsafe<
      { name: string; next_run_at: Date; repeat_interval: string; repeat_timezone: string | null; disabled: boolean; data: unknown }[]
    >(`SELECT name, next_run_at, repeat_interval, repeat_timezone, disabled, data FROM agenda_jobs WHERE name = 'memory.compact'`);
    expect(jobs).toHaveLength(1);
    const [job] = jobs;
    expect(job.disabled).toBe(false);
    expect(job.repeat_interval).toBe("* * * * *");
    expect(job.data).toEqual({ due: true });
    // The next sweep, not a run now: within the coming minute.
    const next = new Date(job.next_run_at).getTime();
    expect(next).toBeGreaterThan(Date.now() - 5_000);
    expect(next).toBeLessThanOrEqual(Date.now() + 61_000);
    const { data } = await engram.gql(`{ tenantSettings { compaction { schedule } } }`);
    expect(data.tenantSettings.compaction.schedule).toBe("17 6 * * *");
  });
});
