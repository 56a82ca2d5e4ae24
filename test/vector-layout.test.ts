import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { ChromaClient } from "chromadb";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startEmbeddedChroma, type ChromaServer } from "../src/embedded/chroma.ts";
import { createLogger } from "../src/log.ts";
import { createChromaVectorStore } from "../src/vectors/chroma.ts";
import type { SnippetVector, VectorStore } from "../src/vectors/index.ts";

// Recall vectors live in one Chroma collection per tenant, model and end user, so a search
// never filters one user out of everybody's vectors; an earlier install's single collection per
// tenant and model is moved into that layout, losing nothing.
let server: ChromaServer;
let chroma: ChromaClient;
let store: VectorStore;
const space = { tenantId: "00000000-0000-4000-8000-00000000000a", model: "offline-use-lite" };
const users = ["00000000-0000-4000-8000-0000000000a1", "00000000-0000-4000-8000-0000000000a2"];

const unit = (seed: number) => {
  const v = Array.from({ length: 8 }, (_, i) => Math.sin(seed * 7 + i * 3));
  const norm = Math.hypot(...v);
  return v.map((x) => x / norm);
};
const vector = (n: number, endUserId: string, conversationId = "c1"): SnippetVector => ({
  id: `00000000-0000-4000-8000-${String(n).padStart(12, "0")}`,
  vector: unit(n),
  endUserId,
  conversationId,
  kind: "TURN",
  occurredAt: new Date("2026-05-01T10:00:00Z"),
});
const names = async () => (await chroma.listCollections({ limit: 1000 })).map((c) => c.name).sort();

beforeAll(async () => {
  server = await startEmbeddedChroma(mkdtempSync(path.join(tmpdir(), "engram-layout-")));
  const url = new URL(server.url);
  chroma = new ChromaClient({ host: url.hostname, port: Number(url.port) });
});
afterAll(async () => {
  await store?.close();
  await server?.stop();
});

describe("the vector layout", () => {
  it("moves an earlier install's collection into per-user collections, then searches each user's alone", async () => {
    // The earlier layout: one collection for the tenant and model, every user's vectors in it.
    const legacy = await chroma.createCollection({
      name: `engram-${space.tenantId}-${space.model}`,
      embeddingFunction: null,
      configuration: { hnsw: { space: "cosine" } },
      metadata: { tenantId: space.tenantId, model: space.model },
    });
    const before = Array.from({ length: 1_200 }, (_, n) => vector(n + 1, users[n % 2], n % 3 === 0 ? "c2" : "c1"));
    await legacy.upsert({
      ids: before.map((v) => v.id),
      embeddings: before.map((v) => v.vector),
      metadatas: before.map((v) => ({ endUserId: v.endUserId, conversationId: v.conversationId, kind: v.kind, occurredAt: 1 })),
    });

    const owner = new Map(before.map((v) => [v.id, v]));
    const expectOwn = (hits: { id: string }[], endUserId: string) => expect(hits.every((h) => owner.get(h.id)?.endUserId === endUserId)).toBe(true);
    store = createChromaVectorStore(async () => server, createLogger("error"));
    // Searched while the move runs in the background (it reads the earlier collection too), and after.
    for (let round = 0; round < 2; round++) {
      const hits = await store.query(space, unit(5), { endUserId: users[0] }, 3);
      expect(hits[0]).toMatchObject({ id: vector(5, users[0]).id });
      expect(hits[0].similarity).toBeCloseTo(1, 5);
      expectOwn(hits, users[0]);
      expect(await store.count(space.tenantId, {})).toBe(1_200); // waits for the move
    }
    expect(await names()).toEqual(users.map((u) => `engram-${space.tenantId}-${space.model}-${u}`).sort());
    expect(await store.count(space.tenantId, { endUserId: users[1] })).toBe(600);

    // Only the user's own vectors answer, and the excluded conversation stays out; a new process
    // (no handles yet) finds the collection by name.
    const fresh = createChromaVectorStore(async () => server, createLogger("error"));
    const other = await fresh.query(space, unit(5), { endUserId: users[1] }, 10);
    expect(other).toHaveLength(10);
    expectOwn(other, users[1]);
    const excluded = await fresh.query(space, unit(4), { endUserId: users[1], excludeConversationId: "c2" }, 50);
    expect(excluded).toHaveLength(50);
    expectOwn(excluded, users[1]);
    expect(excluded.every((h) => owner.get(h.id)?.conversationId !== "c2")).toBe(true);
    await fresh.close();
  });

  it("writes a new user's vectors to their own collection, and forgetting the user takes the collection", async () => {
    const newcomer = "00000000-0000-4000-8000-0000000000a3";
    await store.upsert(space, [vector(5_001, newcomer), vector(5_002, users[0])]);
    expect(await store.count(space.tenantId, { endUserId: newcomer })).toBe(1);
    expect((await store.query(space, unit(5_001), { endUserId: newcomer }, 5)).map((h) => h.id)).toEqual([vector(5_001, newcomer).id]);

    await store.delete(space.tenantId, { endUserId: newcomer });
    expect(await names()).not.toContain(`engram-${space.tenantId}-${space.model}-${newcomer}`);
    expect(await store.query(space, unit(5_001), { endUserId: newcomer }, 5)).toEqual([]);

    // Deletes by id or by conversation reach whichever user's collection holds them.
    await store.delete(space.tenantId, { ids: [vector(5_002, users[0]).id] });
    await store.delete(space.tenantId, { endUserId: users[1], conversationId: "c2" });
    expect(await store.count(space.tenantId, { ids: [vector(5_002, users[0]).id] })).toBe(0);
    expect(await store.count(space.tenantId, { endUserId: users[1], conversationId: "c2" })).toBe(0);
    expect(await store.count(space.tenantId, { endUserId: users[1] })).toBe(400);
  });
});
