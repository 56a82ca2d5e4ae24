import { ChromaClient } from "chromadb";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { OfflineEmbeddings } from "../src/embeddings/offline.ts";
import { reconcileRecall } from "../src/work/reconcile.ts";
import { startEmbeddedChroma, type ChromaServer } from "../src/embedded/chroma.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { startSecondInstance } from "./helpers/instances.ts";
import { allIndexed, CONTEXT, RECALL, say, vectorIds } from "./helpers/recall.ts";
import { until } from "./helpers/until.ts";

// An external Chroma (CHROMA_URL) that goes down and comes back.
let chromaDir: string;
let chroma: ChromaServer;
let engram: TestEngram;

beforeAll(async () => {
  chromaDir = mkdtempSync(path.join(tmpdir(), "engram-chroma-"));
  chroma = await startEmbeddedChroma(chromaDir);
  engram = await startTestEngram({ worker: true, env: { CHROMA_URL: chroma.url, ENGRAM_VECTOR_SEARCH_TIMEOUT_MS: "3000" } });
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await chroma?.stop();
  rmSync(chromaDir, { recursive: true, force: true });
});

describe("with Chroma down", () => {
  it("still answers context, and indexing catches up when Chroma is back", async () => {
    const first = await say(engram, { user: "ivan", conversation: "i-1" }, "I ordered the blue trail running shoes.", "Ordered.");
    await allIndexed(engram);

    await chroma.stop();
    const now = await say(engram, { user: "ivan", conversation: "i-2" }, "I also ordered a yellow raincoat.", "Ordered too.");
    // The worker makes the turn's snippet, then fails to embed it while Chroma is down.
    const pending = await until("the new turn's snippet", () =>
      engram.services.db.recallSnippet.findFirst({ where: { conversationId: now.conversationId } }),
    );

    const { data, errors } = await engram.gql(CONTEXT, {
      input: { conversationId: now.conversationId, message: "Can you order the same shoes as last time?" },
    });
    expect(errors).toBeUndefined();
    expect(data.context.blocks.map((b: any) => b.kind)).toContain("TAIL");
    // Recall answers from keyword matches, and the context says what it did without.
    expect(data.context.blocks.find((b: any) => b.kind === "RECALL")?.text).toMatch(/blue trail running shoes/);
    expect(data.context.degraded).toEqual(["vector search unavailable: the vector store refused or failed the search"]);
    // Keyword matches still answer the debug query, which says what is missing.
    const degraded = await engram.gql(RECALL, { input: { endUserId: first.endUserId, text: "running shoes" } });
    expect(degraded.data.recall.degraded).toMatch(/vector search unavailable/);
    expect(degraded.data.recall.candidates[0]).toMatchObject({ conversationId: first.conversationId, vectorScore: null, keywordRank: 1 });

    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect((await engram.services.db.recallSnippet.findUniqueOrThrow({ where: { id: pending.id } })).indexedAt).toBeNull();

    chroma = await startEmbeddedChroma(chromaDir, { port: Number(new URL(chroma.url).port) });
    await until("the retried indexing", async () => (await engram.services.db.recallSnippet.findUniqueOrThrow({ where: { id: pending.id } })).indexedAt, 45_000);
    const back = await engram.gql(RECALL, {
      input: { endUserId: first.endUserId, text: "yellow raincoat", mode: "VECTOR", excludeConversationId: first.conversationId },
    });
    expect(back.data.recall.degraded).toBeNull();
    expect(back.data.recall.candidates[0]).toMatchObject({ snippetId: pending.id, vectorRank: 1 });
    // What was indexed before the outage survived it (Chroma keeps its data on disk).
    const old = await engram.gql(RECALL, { input: { endUserId: first.endUserId, text: "running shoes", mode: "VECTOR" } });
    expect(old.data.recall.candidates.map((c: any) => c.conversationId)).toContain(first.conversationId);
  });

  it("forgets a conversation with Chroma down, and its worker deletes the vectors owed once Chroma is back", async () => {
    const turn = await say(engram, { user: "olga", conversation: "o-1" }, "My locker code is 4417.", "Noted.");
    await allIndexed(engram);
    const port = Number(new URL(chroma.url).port);
    const client = new ChromaClient({ host: "127.0.0.1", port });
    const left = () => vectorIds(client, engram.tenant.tenantId, { conversationId: turn.conversationId });
    expect(await left()).not.toEqual([]);

    await chroma.stop();
    const { data, errors } = await engram.gql(`mutation($id: ID!) { deleteConversation(id: $id) { messages snippets } }`, { id: turn.conversationId });
    expect(errors).toBeUndefined();
    expect(data.deleteConversation).toMatchObject({ messages: 2, snippets: 1 });
    // Owed as jobs (not left to reconcile's sweep, which would take them too, in time).
    const [{ owed }] = await engram.services.db.$queryRaw<{ owed: number }[]>`
      SELECT count(*)::int AS "owed" FROM "agenda_jobs" WHERE "name" = 'recall.delete-vectors' AND "data"->>'tenantId' = ${engram.tenant.tenantId}`;
    expect(owed).toBeGreaterThan(0);
    chroma = await startEmbeddedChroma(chromaDir, { port });
    await until("the owed deletes", async () => (await left()).length === 0, 30_000);
  });

  it("forgets a user while Chroma hangs, and its worker deletes the vectors owed once Chroma answers", { timeout: 240_000 }, async () => {
    const turn = await say(engram, { user: "petra", conversation: "p-1" }, "My safe's combination is 31-7-22.", "Noted.");
    await allIndexed(engram);
    const port = Number(new URL(chroma.url).port);
    const left = () => vectorIds(new ChromaClient({ host: "127.0.0.1", port }), engram.tenant.tenantId, { endUserId: turn.endUserId });
    expect(await left()).not.toEqual([]);

    // Stopped, not ended: Chroma takes the connection and never answers.
    process.kill(chroma.pid!, "SIGSTOP");
    try {
      // Answered at all: a forget held for as long as Chroma hangs fails at the test's timeout.
      const answer = await engram.gql(`mutation($id: ID!) { forgetUser(endUserId: $id) { messages snippets } }`, { id: turn.endUserId });
      expect(answer.errors).toBeUndefined();
      expect(answer.data.forgetUser).toMatchObject({ messages: 2, snippets: 1 });
      const [{ owed }] = await engram.services.db.$queryRaw<{ owed: number }[]>`
        SELECT count(*)::int AS "owed" FROM "agenda_jobs" WHERE "name" = 'recall.delete-vectors' AND "data"->>'tenantId' = ${engram.tenant.tenantId}
          AND "next_run_at" IS NOT NULL`;
      expect(owed).toBeGreaterThan(0);
    } finally {
      process.kill(chroma.pid!, "SIGCONT");
    }
    // The job retries with growing delays (a minute apart by then).
    await until("the owed deletes", async () => (await left()).length === 0, 150_000);
  });

  it("reconcile re-indexes a snippet a crash left without its vector", async () => {
    const turn = await say(engram, { user: "ivan", conversation: "i-3" }, "My bike is a green Brompton.", "Nice.");
    await allIndexed(engram);
    const snippet = await engram.services.db.recallSnippet.findFirstOrThrow({ where: { conversationId: turn.conversationId } });
    // A crash between the database and Chroma: the row without its vector.
    await engram.services.vectors.delete(engram.tenant.tenantId, { ids: [snippet.id] });
    await engram.services.db.recallSnippet.update({ where: { id: snippet.id }, data: { indexedAt: null } });

    const requeued = await reconcileRecall(engram.services.deps, {}, { graceMs: 0 });
    expect(requeued[engram.tenant.tenantId]).toBe(1);
    await allIndexed(engram);
    expect(await engram.services.vectors.count(engram.tenant.tenantId, { ids: [snippet.id] })).toBe(1);
  });

  it("reconcile re-indexes a snippet marked indexed whose vector Chroma lost", async () => {
    const turn = await say(engram, { user: "ivan", conversation: "i-4" }, "My scooter is a red Vespa.", "Lovely.");
    await allIndexed(engram);
    const snippet = await engram.services.db.recallSnippet.findFirstOrThrow({ where: { conversationId: turn.conversationId } });
    expect(snippet.indexedAt).not.toBeNull();
    // An upsert Chroma acknowledged, then lost as it died: the row still says indexed.
    await engram.services.vectors.delete(engram.tenant.tenantId, { ids: [snippet.id] });

    const requeued = await reconcileRecall(engram.services.deps, {}, { graceMs: 0 });
    expect(requeued[engram.tenant.tenantId]).toBe(1);
    await allIndexed(engram);
    expect(await engram.services.vectors.count(engram.tenant.tenantId, { ids: [snippet.id] })).toBe(1);
    // Nothing lost, nothing re-queued.
    expect(await reconcileRecall(engram.services.deps, {}, { graceMs: 0 })).toEqual({});
  });

  it("reconcile still re-queues a snippet waiting for its vector while Chroma cannot be asked", async () => {
    await chroma.stop();
    const turn = await say(engram, { user: "ivan", conversation: "i-5" }, "My kayak is a yellow Dagger.", "Fun.");
    const pending = await until("the new turn's snippet", () =>
      engram.services.db.recallSnippet.findFirst({ where: { conversationId: turn.conversationId } }),
    );
    const requeued = await reconcileRecall(engram.services.deps, {}, { graceMs: 0 });
    expect(requeued[engram.tenant.tenantId]).toBeGreaterThanOrEqual(1);
    chroma = await startEmbeddedChroma(chromaDir, { port: Number(new URL(chroma.url).port) });
    await allIndexed(engram, engram.tenant.tenantId, 60_000);
    expect(await engram.services.vectors.count(engram.tenant.tenantId, { ids: [pending.id] })).toBe(1);
  });

  it("answers from keywords when Chroma hangs, once the search timeout passes, and refuses a VECTOR recall with a typed error", { timeout: 90_000 }, async () => {
    const turn = await say(engram, { user: "jun", conversation: "j-1" }, "I keep my passport in the blue drawer.", "Noted.");
    await allIndexed(engram);
    // Stopped, not ended: the connection is accepted and never answered. Jun's vectors have no
    // copy in this process yet, so the search asks Chroma.
    process.kill(chroma.pid!, "SIGSTOP");
    try {
      const hybrid = await engram.gql(RECALL, { input: { endUserId: turn.endUserId, text: "where is my passport" } });
      expect(hybrid.errors).toBeUndefined();
      expect(hybrid.data.recall.degraded).toMatch(/vector search unavailable: Chroma gave no answer within 3000 ms/);
      expect(hybrid.data.recall.candidates[0]).toMatchObject({ conversationId: turn.conversationId, vectorScore: null, keywordRank: 1 });
      // For three timeouts after, Chroma is not searched (nor waited for) again.
      const vector = await engram.gql(RECALL, { input: { endUserId: turn.endUserId, text: "where is my passport", mode: "VECTOR" } });
      expect(vector.errors?.[0]).toMatchObject({
        message: "Vector search unavailable: Chroma gave no answer within 3000 ms to a recent search; not searched again yet",
        extensions: { code: "VECTOR_STORE_UNAVAILABLE" },
      });
      const context = await engram.gql(CONTEXT, { input: { conversationId: turn.conversationId, message: "Where did I say my passport is?" } });
      expect(context.errors).toBeUndefined();
      // Asked for a conversation with no turn yet, so the passport turn is recall's to find: by keywords.
      const recalled = await engram.gql(CONTEXT, {
        input: { agentExternalId: "shop", endUserExternalId: "jun", conversationExternalId: "j-2", message: "Remember where I told you I keep my passport?" },
      });
      expect(recalled.errors).toBeUndefined();
      expect(recalled.data.context.blocks.find((b: any) => b.kind === "RECALL")?.text).toMatch(/passport in the blue drawer/);
      expect(recalled.data.context.degraded).toEqual([
        "vector search unavailable: Chroma gave no answer within 3000 ms to a recent search; not searched again yet",
      ]);
    } finally {
      process.kill(chroma.pid!, "SIGCONT");
    }
    // Then a search tries again, and Chroma answers.
    const back = await until("a vector search Chroma answers", async () => {
      const { data } = await engram.gql(RECALL, { input: { endUserId: turn.endUserId, text: "where is my passport", mode: "VECTOR" } });
      return data?.recall;
    }, 30_000);
    expect(back.candidates[0]).toMatchObject({ conversationId: turn.conversationId, vectorRank: 1 });
  });

  it("answers an instance's first search from keywords within the search timeout when Chroma hangs before the collection is open", { timeout: 120_000 }, async () => {
    const turn = await say(engram, { user: "kim", conversation: "k-1" }, "My spare house key is under the green flowerpot.", "Noted.");
    await allIndexed(engram);
    // A fresh instance: it has not opened the tenant's collection yet, and holds no copy of Kim's vectors.
    const fresh = await startSecondInstance(engram, { CHROMA_URL: chroma.url, ENGRAM_VECTOR_SEARCH_TIMEOUT_MS: "3000" });
    const gql = async (query: string, variables: Record<string, unknown>) => {
      const response = await fresh.app.yoga.fetch("http://engram.test/graphql", {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${engram.tenant.admin}` },
        body: JSON.stringify({ query, variables }),
      });
      return (await response.json()) as { data: any; errors?: unknown[] };
    };
    try {
      process.kill(chroma.pid!, "SIGSTOP");
      try {
        // Opening the collection waits on the hung Chroma too: the search's timeout covers it.
        const first = await gql(RECALL, { input: { endUserId: turn.endUserId, text: "where is the spare house key" } });
        expect(first.errors).toBeUndefined();
        expect(first.data.recall.degraded).toBe("vector search unavailable: Chroma gave no answer within 3000 ms");
        expect(first.data.recall.candidates[0]).toMatchObject({ conversationId: turn.conversationId, vectorScore: null, keywordRank: 1 });
        const context = await gql(CONTEXT, { input: { conversationId: turn.conversationId, message: "Where did I leave the spare key?" } });
        expect(context.errors).toBeUndefined();
      } finally {
        process.kill(chroma.pid!, "SIGCONT");
      }
      // The open went on without the search; once Chroma answers it, searches find the vector.
      const back = await until("a vector search Chroma answers on the fresh instance", async () => {
        const { data } = await gql(RECALL, { input: { endUserId: turn.endUserId, text: "where is the spare house key", mode: "VECTOR" } });
        return data?.recall;
      }, 30_000);
      expect(back.candidates[0]).toMatchObject({ conversationId: turn.conversationId, vectorRank: 1 });
    } finally {
      await fresh.stop();
    }
  });
});

describe("with the embedder failing", () => {
  it("decides recall by keywords, answers from keyword matches, and says so", async () => {
    await say(engram, { user: "kim", conversation: "k-1" }, "I bought a green ceramic teapot for my aunt.", "Lovely gift.");
    await allIndexed(engram);
    const encoder = vi.spyOn(OfflineEmbeddings.prototype, "embedQuery").mockRejectedValue(new Error("the encoder's worker exited"));
    try {
      const asked = { agentExternalId: "shop", endUserExternalId: "kim", conversationExternalId: "k-2" };
      const reason = "vector search unavailable: the message could not be embedded; recall was decided by keywords";
      const { data, errors } = await engram.gql(CONTEXT, { input: { ...asked, message: "Which teapot did I buy last time?" } });
      expect(errors).toBeUndefined();
      expect(data.context.blocks.find((b: any) => b.kind === "RECALL")?.text).toMatch(/green ceramic teapot/);
      expect(data.context.degraded).toEqual([reason]);
      // The search did not embed the message again.
      expect(encoder).toHaveBeenCalledTimes(1);
      // No keyword asks for recall: none is made, and the caller still learns why it was decided so.
      const plain = await engram.gql(CONTEXT, { input: { ...asked, message: "Which teapot is best for green tea?" } });
      expect(plain.errors).toBeUndefined();
      expect(plain.data.context.blocks.map((b: any) => b.kind)).not.toContain("RECALL");
      expect(plain.data.context.degraded).toEqual([reason]);
    } finally {
      encoder.mockRestore();
    }
  });

  it("answers recall from keyword matches and says why in its own words, not the encoder's", async () => {
    const failure = new Error("the encoder's worker exited");
    failure.stack = "Error: the encoder's worker exited\n    at /srv/engram/src/embeddings/encoder-worker.mjs:19:5";
    const encoder = vi.spyOn(OfflineEmbeddings.prototype, "embedQuery").mockRejectedValue(failure);
    try {
      const user = await engram.services.db.endUser.findFirstOrThrow({ where: { externalId: "kim" } });
      const { data, errors } = await engram.gql(RECALL, { input: { endUserId: user.id, text: "Which teapot did I buy?" } });
      expect(errors).toBeUndefined();
      expect(data.recall.candidates[0].text).toMatch(/green ceramic teapot/);
      expect(data.recall.degraded).toBe("vector search unavailable: the query could not be embedded (the server's log has the error)");
    } finally {
      encoder.mockRestore();
    }
  });

  it("says recall was left out when it failed outright", async () => {
    const embedder = vi.spyOn(engram.services.embeddings, "forTenant").mockRejectedValue(new Error("no route for this tenant"));
    try {
      const { data, errors } = await engram.gql(CONTEXT, {
        input: { agentExternalId: "shop", endUserExternalId: "kim", conversationExternalId: "k-3", message: "Which teapot did I buy last time?" },
      });
      expect(errors).toBeUndefined();
      expect(data.context.blocks.map((b: any) => b.kind)).not.toContain("RECALL");
      // The error's own words stay in the server's log.
      expect(data.context.degraded).toEqual(["recall unavailable: the context was assembled without it"]);
    } finally {
      embedder.mockRestore();
    }
  });
});
