import { ChromaClient } from "chromadb";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startEmbeddedChroma, type ChromaServer } from "../src/embedded/chroma.ts";
import { createLogger } from "../src/log.ts";
import { createEngramPubSub, type PubSub } from "../src/pubsub.ts";
import { withVectorCache, type CachedVectorStore, type VectorCacheOptions } from "../src/vectors/cache.ts";
import { collectionName, createChromaVectorStore } from "../src/vectors/chroma.ts";
import type { SnippetVector, VectorSpace, VectorStore } from "../src/vectors/index.ts";
import { until } from "./helpers/until.ts";

// The in-process copies of users' vectors (src/vectors/cache.ts) over a real embedded Chroma.
const log = createLogger("silent");
let dir: string;
let chroma: ChromaServer;
let seed = 7;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const randomVector = () => Array.from({ length: 64 }, () => rand() - 0.5);
const cosine = (a: number[], b: number[]) => {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) (dot += a[i] * b[i]), (na += a[i] * a[i]), (nb += b[i] * b[i]);
  return dot / Math.sqrt(na * nb);
};

beforeAll(async () => {
  dir = mkdtempSync(path.join(tmpdir(), "engram-vector-cache-"));
  chroma = await startEmbeddedChroma(dir);
}, 60_000);
afterAll(async () => {
  await chroma?.stop();
  rmSync(dir, { recursive: true, force: true });
});

/** A gate a test opens: what waits on it goes on once it is opened. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

type Counted = VectorStore & {
  queries: number;
  loads: number;
  /** When set, a load has read Chroma and waits on it before answering. */
  loadGate?: Promise<void>;
  /** When set, a delete waits on it before it reaches Chroma. */
  deleteGate?: Promise<void>;
  /** Reads by id (a load's, a reload's changes, another instance's new vectors), the ids read, and when set, what they wait on after reading Chroma. */
  fetches: number;
  fetched: number;
  fetchGate?: Promise<void>;
  /** Chroma cannot be read: searches and reads fail. */
  down?: boolean;
};

/** A Chroma store under the cache that counts the searches Chroma answered and the loads, and can hold them. */
function counted(): Counted {
  const store = createChromaVectorStore(async () => chroma, log);
  const wrapped: Counted = { ...store, queries: 0, loads: 0, fetches: 0, fetched: 0 };
  const refuse = () => {
    if (wrapped.down) throw new Error("Chroma down");
  };
  wrapped.vectorsByIds = async (...args) => {
    refuse();
    wrapped.fetches++;
    wrapped.fetched += args[1].length;
    const read = await store.vectorsByIds(...args);
    await wrapped.fetchGate;
    return read;
  };
  wrapped.query = async (...args) => {
    refuse();
    wrapped.queries++;
    return store.query(...args);
  };
  wrapped.versionsOf = async (...args) => {
    refuse();
    wrapped.loads++;
    const listed = await store.versionsOf(...args);
    await wrapped.loadGate;
    return listed;
  };
  wrapped.delete = async (...args) => {
    await wrapped.deleteGate;
    return store.delete(...args);
  };
  return wrapped;
}

function cacheOver(options: Partial<VectorCacheOptions> & { pubsub?: PubSub } = {}): { chromaStore: Counted; cache: CachedVectorStore } {
  const chromaStore = counted();
  const cache = withVectorCache(chromaStore, {
    maxBytes: 64 * 2 ** 20,
    ttlMs: 30_000,
    log,
    ...options,
    pubsub: options.pubsub ?? createEngramPubSub(),
  });
  return { chromaStore, cache };
}

let spaceNo = 0;
/** A fresh tenant with two users: `a` with 300 vectors over 5 conversations (two pages of a load), `b` with 50. */
async function corpus(store: VectorStore, tenantId = `t${++spaceNo}-${Date.now()}`) {
  const space: VectorSpace = { tenantId, model: "test-64" };
  const vectors: SnippetVector[] = [];
  for (let i = 0; i < 350; i++) {
    const user = i < 300 ? "a" : "b";
    vectors.push({
      id: `${user}-${i}`,
      vector: randomVector(),
      endUserId: user,
      conversationId: `${user}-c${i % 5}`,
      kind: "TURN",
      occurredAt: new Date(Date.UTC(2025, 0, 1 + (i % 60))),
    });
  }
  await store.upsert(space, vectors);
  return { space, vectors };
}

/** The exact k nearest of a user's vectors, as the cache must answer. */
function exact(vectors: SnippetVector[], query: number[], user: string, k: number, exclude?: string) {
  return vectors
    .filter((v) => v.endUserId === user && v.conversationId !== exclude)
    .map((v) => ({ id: v.id, similarity: cosine(v.vector, query) }))
    .sort((x, y) => y.similarity - x.similarity)
    .slice(0, k);
}

describe("the vector cache", () => {
  it("loads a user's vectors on their first search, which Chroma answers, then answers exactly itself", async () => {
    const { chromaStore, cache } = cacheOver();
    const { space, vectors } = await corpus(cache);
    const query = randomVector();
    const first = await cache.query(space, query, { endUserId: "a", excludeConversationId: "a-c0" }, 10);
    expect(chromaStore.queries).toBe(1);
    await cache.loaded();
    expect(cache.stats()).toMatchObject({ users: 1, vectors: 300 });

    const second = await cache.query(space, query, { endUserId: "a", excludeConversationId: "a-c0" }, 10);
    expect(chromaStore.queries).toBe(1);
    const expected = exact(vectors, query, "a", 10, "a-c0");
    expect(second.map((h) => h.id)).toEqual(expected.map((h) => h.id));
    second.forEach((h, i) => expect(h.similarity).toBeCloseTo(expected[i].similarity, 5));
    // Chroma's approximate answer agrees on this small collection.
    expect(first.map((h) => h.id)).toEqual(expected.map((h) => h.id));
    // Another user is not in this user's copy, and their own first search goes to Chroma.
    expect(second.every((h) => h.id.startsWith("a-"))).toBe(true);
    expect((await cache.query(space, query, { endUserId: "b" }, 5)).every((h) => h.id.startsWith("b-"))).toBe(true);
    expect(chromaStore.queries).toBe(2);
    await cache.close();
  });

  it("sees this instance's writes at once: upserts, and deletes by ids, conversation, date and user", async () => {
    const { chromaStore, cache } = cacheOver();
    const { space, vectors } = await corpus(cache);
    await cache.query(space, randomVector(), { endUserId: "a" }, 1);
    await cache.loaded();
    const before = chromaStore.queries;

    const probe = randomVector();
    await cache.upsert(space, [{ id: "a-new", vector: probe, endUserId: "a", conversationId: "a-c9", kind: "FACT", occurredAt: new Date() }]);
    expect((await cache.query(space, probe, { endUserId: "a" }, 3))[0]).toMatchObject({ id: "a-new" });
    expect((await cache.query(space, probe, { endUserId: "a", excludeConversationId: "a-c9" }, 3))[0].id).not.toBe("a-new");

    await cache.delete(space.tenantId, { ids: ["a-new"] });
    expect((await cache.query(space, probe, { endUserId: "a" }, 300)).map((h) => h.id)).not.toContain("a-new");

    await cache.delete(space.tenantId, { conversationId: "a-c1" });
    const afterConversation = await cache.query(space, probe, { endUserId: "a" }, 300);
    expect(afterConversation).toHaveLength(240);
    expect(afterConversation.every((h) => vectors.find((v) => v.id === h.id)!.conversationId !== "a-c1")).toBe(true);

    const cutoff = new Date(Date.UTC(2025, 0, 31));
    await cache.delete(space.tenantId, { occurredBefore: cutoff });
    const left = await cache.query(space, probe, { endUserId: "a" }, 300);
    expect(left.length).toBeGreaterThan(0);
    for (const hit of left) expect(vectors.find((v) => v.id === hit.id)!.occurredAt >= cutoff).toBe(true);
    // Chroma holds the same: the copy and the store agree.
    expect(await chromaStore.count(space.tenantId, { endUserId: "a" })).toBe(left.length);

    await cache.delete(space.tenantId, { endUserId: "a" });
    expect(await cache.query(space, probe, { endUserId: "a" }, 10)).toEqual([]);
    expect(chromaStore.queries).toBe(before);
    await cache.close();
  });

  it("applies again, once loaded, the writes that landed while a user's copy was loading", async () => {
    const { chromaStore, cache } = cacheOver();
    const { space } = await corpus(cache);
    const probe = randomVector();
    const held = gate();
    chromaStore.loadGate = held.opened;
    await cache.query(space, probe, { endUserId: "a" }, 1); // starts the load, which reads Chroma and waits
    await until("the load's read", async () => chromaStore.loads === 1);
    await cache.upsert(space, [{ id: "a-during", vector: probe, endUserId: "a", conversationId: "a-c0", kind: "TURN", occurredAt: new Date() }]);
    await cache.delete(space.tenantId, { ids: ["a-0", "a-1"] });
    held.open();
    await cache.loaded();
    const hits = await cache.query(space, probe, { endUserId: "a" }, 300);
    expect(cache.stats().users).toBe(1);
    expect(hits[0].id).toBe("a-during");
    expect(hits.map((h) => h.id)).not.toContain("a-0");
    expect(hits.map((h) => h.id)).not.toContain("a-1");
    expect(hits).toHaveLength(299);
    await cache.close();
  });

  it("never answers a vector whose delete has started, even from a copy loaded before Chroma deleted it", async () => {
    const { chromaStore, cache } = cacheOver();
    const { space, vectors } = await corpus(cache);
    const held = gate();
    chromaStore.deleteGate = held.opened;
    const forgetting = cache.delete(space.tenantId, { ids: ["a-5"] }); // waits before reaching Chroma
    await cache.query(space, vectors[5].vector, { endUserId: "a" }, 1); // Chroma still has it, and answers
    await cache.loaded();
    expect(cache.stats().users).toBe(1);
    expect((await cache.query(space, vectors[5].vector, { endUserId: "a" }, 300)).map((h) => h.id)).not.toContain("a-5");
    held.open();
    await forgetting;
    expect(await chromaStore.count(space.tenantId, { ids: ["a-5"] })).toBe(0);
    await cache.close();
  });

  it("keeps tenants apart: the same end user id in two tenants has two copies", async () => {
    const { cache } = cacheOver();
    const one = await corpus(cache);
    const two = await corpus(cache, `${one.space.tenantId}-other`);
    for (const { space } of [one, two]) {
      await cache.query(space, randomVector(), { endUserId: "a" }, 1);
      await cache.loaded();
    }
    expect(cache.stats().users).toBe(2);
    // The same ids in both tenants: each answer is its own tenant's vectors.
    const probe = one.vectors[7].vector;
    expect((await cache.query(one.space, probe, { endUserId: "a" }, 1))[0]).toMatchObject({ id: "a-7" });
    expect((await cache.query(two.space, probe, { endUserId: "a" }, 1))[0].similarity).toBeLessThan(0.99);
    await cache.delete(one.space.tenantId, { endUserId: "a" });
    expect(await cache.query(one.space, probe, { endUserId: "a" }, 5)).toEqual([]);
    expect(await cache.query(two.space, probe, { endUserId: "a" }, 5)).toHaveLength(5);
    await cache.close();
  });

  it("applies another instance's announced changes, and reloads a copy older than ttlMs without them", async () => {
    const pubsub = createEngramPubSub();
    const one = cacheOver({ pubsub });
    const two = cacheOver({ pubsub });
    const { space } = await corpus(one.cache);
    await one.cache.query(space, randomVector(), { endUserId: "a" }, 1);
    await one.cache.loaded();
    expect(one.cache.stats().users).toBe(1);
    const queries = one.chromaStore.queries;

    // A new vector written by the other instance is read by id into this one's copy.
    const probe = randomVector();
    await two.cache.upsert(space, [{ id: "a-elsewhere", vector: probe, endUserId: "a", conversationId: "a-c2", kind: "TURN", occurredAt: new Date() }]);
    await until("the other instance's vector", async () => (await one.cache.query(space, probe, { endUserId: "a" }, 1))[0].id === "a-elsewhere");
    // Its deletes are applied by their selector.
    await two.cache.delete(space.tenantId, { conversationId: "a-c2" });
    await until("the other instance's delete", async () => one.cache.stats().vectors === 240);
    expect((await one.cache.query(space, probe, { endUserId: "a" }, 300)).map((h) => h.id)).not.toContain("a-elsewhere");
    expect(one.chromaStore.queries).toBe(queries);
    expect(one.chromaStore.loads).toBe(1);

    // A delete that lands while another instance's new vector is being read wins over it.
    const held = gate();
    one.chromaStore.fetchGate = held.opened;
    const fetches = one.chromaStore.fetches;
    await two.cache.upsert(space, [{ id: "a-late", vector: probe, endUserId: "a", conversationId: "a-c4", kind: "TURN", occurredAt: new Date() }]);
    await until("the read by id", async () => one.chromaStore.fetches === fetches + 1);
    await one.cache.delete(space.tenantId, { ids: ["a-late"] });
    held.open();
    // What is left of the read once Chroma has answered runs in microtasks: one timer turn is enough.
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(one.cache.stats().vectors).toBe(240);
    expect((await one.cache.query(space, probe, { endUserId: "a" }, 300)).map((h) => h.id)).not.toContain("a-late");
    one.chromaStore.fetchGate = undefined;

    // No announcement reaches an instance on another pubsub (no Redis): its copy lasts ttlMs.
    let clock = 0;
    const three = cacheOver({ now: () => clock });
    await three.cache.query(space, probe, { endUserId: "a" }, 1);
    await three.cache.loaded();
    await two.cache.upsert(space, [{ id: "a-unheard", vector: probe, endUserId: "a", conversationId: "a-c2", kind: "TURN", occurredAt: new Date() }]);
    expect((await three.cache.query(space, probe, { endUserId: "a" }, 2)).map((h) => h.id)).not.toContain("a-unheard");
    clock += 30_000;
    // The stale copy answers once more while its replacement loads.
    expect((await three.cache.query(space, probe, { endUserId: "a" }, 2)).map((h) => h.id)).not.toContain("a-unheard");
    // Its own write meanwhile reaches both the stale copy and the one loading.
    const own = randomVector();
    await three.cache.upsert(space, [{ id: "a-own", vector: own, endUserId: "a", conversationId: "a-c3", kind: "TURN", occurredAt: new Date() }]);
    expect((await three.cache.query(space, own, { endUserId: "a" }, 1))[0].id).toBe("a-own");
    await three.cache.loaded();
    expect((await three.cache.query(space, own, { endUserId: "a" }, 1))[0].id).toBe("a-own");
    expect(three.chromaStore.queries).toBe(1);
    expect((await three.cache.query(space, probe, { endUserId: "a" }, 2)).map((h) => h.id)).toContain("a-unheard");
    expect(three.cache.stats().users).toBe(1);

    // A reload reads again only what changed: here a vector rewritten under the same id by the
    // unheard instance, and one it added; the user's other vectors come from the copy it replaces.
    const rewritten = randomVector();
    await two.cache.upsert(space, [{ id: "a-7", vector: rewritten, endUserId: "a", conversationId: "a-c2", kind: "TURN", occurredAt: new Date() }]);
    await two.cache.upsert(space, [{ id: "a-new", vector: randomVector(), endUserId: "a", conversationId: "a-c1", kind: "TURN", occurredAt: new Date() }]);
    const fetched = three.chromaStore.fetched;
    clock += 30_000;
    await three.cache.query(space, probe, { endUserId: "a" }, 1);
    await three.cache.loaded();
    expect(three.chromaStore.fetched - fetched).toBe(2);
    const hit = (await three.cache.query(space, rewritten, { endUserId: "a" }, 1))[0];
    expect(hit.id).toBe("a-7");
    expect(hit.similarity).toBeCloseTo(1, 5);
    // The copy and Chroma hold the same vectors: the reloaded copy answers as a full read would.
    const full = cacheOver();
    await full.cache.query(space, probe, { endUserId: "a" }, 1);
    await full.cache.loaded();
    expect(full.cache.stats().vectors).toBe(three.cache.stats().vectors);
    const any = randomVector();
    expect(await three.cache.query(space, any, { endUserId: "a" }, 20)).toEqual(await full.cache.query(space, any, { endUserId: "a" }, 20));
    await full.cache.close();
    await Promise.all([one.cache.close(), two.cache.close(), three.cache.close()]);
  });

  it("does not answer from a copy twice ttlMs old (its user not searched meanwhile): Chroma does, while it reloads", async () => {
    let clock = 0;
    const writer = cacheOver();
    const reader = cacheOver({ now: () => clock });
    const { space } = await corpus(writer.cache);
    await reader.cache.query(space, randomVector(), { endUserId: "a" }, 1);
    await reader.cache.loaded();
    // Unheard: the two are on separate pubsubs (no Redis).
    const probe = randomVector();
    await writer.cache.upsert(space, [{ id: "a-unheard", vector: probe, endUserId: "a", conversationId: "a-c2", kind: "TURN", occurredAt: new Date() }]);
    clock += 60_000;
    const queries = reader.chromaStore.queries;
    expect((await reader.cache.query(space, probe, { endUserId: "a" }, 1))[0].id).toBe("a-unheard");
    expect(reader.chromaStore.queries).toBe(queries + 1);
    await reader.cache.loaded();
    expect((await reader.cache.query(space, probe, { endUserId: "a" }, 1))[0].id).toBe("a-unheard");
    expect(reader.chromaStore.queries).toBe(queries + 1);
    await Promise.all([writer.cache.close(), reader.cache.close()]);
  });

  it("drops copies twice ttlMs old that nobody searched since, so no user's vectors stay in memory for good", async () => {
    let clock = 0;
    const { cache } = cacheOver({ now: () => clock });
    const { space } = await corpus(cache);
    await cache.query(space, randomVector(), { endUserId: "a" }, 1);
    await cache.query(space, randomVector(), { endUserId: "b" }, 1);
    await cache.loaded();
    expect(cache.stats().users).toBe(2);
    clock += 45_000;
    await cache.query(space, randomVector(), { endUserId: "b" }, 1); // b's copy is reloaded; a's is not searched
    await cache.loaded();
    clock += 31_000; // a's copy is 76 s old, b's 31 s
    await cache.query(space, randomVector(), { endUserId: "b" }, 1);
    expect(cache.stats().users).toBe(1);
    await cache.close();
  });

  it("keeps a copy its user is still searched with, however old, while Chroma cannot be read", async () => {
    let clock = 0;
    const { chromaStore, cache } = cacheOver({ now: () => clock });
    const { space } = await corpus(cache);
    const probe = randomVector();
    await cache.upsert(space, [{ id: "a-probe", vector: probe, endUserId: "a", conversationId: "a-c9", kind: "TURN", occurredAt: new Date() }]);
    await cache.query(space, probe, { endUserId: "a" }, 1);
    await cache.loaded();
    chromaStore.down = true;
    const answers: string[] = [];
    for (let t = 0; t < 8; t++) {
      clock += 20_000;
      // Between the reloads' retries the copy answers; when a retry is due, Chroma is asked and fails.
      const hits = await cache.query(space, probe, { endUserId: "a" }, 1).catch(() => []);
      answers.push(hits[0]?.id ?? "none");
      await cache.loaded();
    }
    expect(cache.stats().users).toBe(1);
    expect(answers.at(-1)).toBe("a-probe");
    chromaStore.down = false;
    await cache.close();
  });

  it("queues the loads asked for while four run, so every user searched gets a copy, and every stale one is reloaded", async () => {
    let clock = 0;
    const { chromaStore, cache } = cacheOver({ now: () => clock });
    const space: VectorSpace = { tenantId: `t${++spaceNo}-${Date.now()}`, model: "test-64" };
    const users = ["u1", "u2", "u3", "u4", "u5", "u6", "u7"];
    await cache.upsert(
      space,
      users.flatMap((user) =>
        Array.from({ length: 20 }, (_, i) => ({ id: `${user}-${i}`, vector: randomVector(), endUserId: user, conversationId: `${user}-c`, kind: "TURN" as const, occurredAt: new Date() })),
      ),
    );
    const held = gate();
    chromaStore.loadGate = held.opened;
    for (const user of users) await cache.query(space, randomVector(), { endUserId: user }, 1);
    held.open();
    await cache.loaded();
    expect(cache.stats()).toMatchObject({ users: 7, vectors: 140 });
    expect(chromaStore.loads).toBe(7);
    // All of them older than ttlMs, and searched while four reloads run: all are reloaded.
    clock += 30_000;
    const again = gate();
    chromaStore.loadGate = again.opened;
    for (const user of users) await cache.query(space, randomVector(), { endUserId: user }, 1);
    again.open();
    await cache.loaded();
    expect(chromaStore.loads).toBe(14);
    expect(chromaStore.queries).toBe(7);
    await cache.close();
  });

  it("reads every vector again once in ten TTLs, so a writer that sets no fingerprint is caught up with", async () => {
    let clock = 0;
    const { chromaStore, cache } = cacheOver({ now: () => clock });
    const { space } = await corpus(cache);
    await cache.query(space, randomVector(), { endUserId: "a" }, 1);
    await cache.loaded();
    // Another writer (an older Engram) rewrites a-7 straight into Chroma with no fingerprint:
    // Chroma keeps the metadata it had, fingerprint included.
    const rewritten = randomVector();
    const client = new ChromaClient({ host: "127.0.0.1", port: Number(new URL(chroma.url).port) });
    const collection = await client.getCollection({ name: collectionName(space), embeddingFunction: null } as never);
    await collection.upsert({ ids: ["a-7"], embeddings: [rewritten], metadatas: [{ endUserId: "a", conversationId: "a-c2" }] });
    const top = async () => (await cache.query(space, rewritten, { endUserId: "a" }, 1))[0];
    for (let reload = 1; reload < 10; reload++) {
      clock += 30_000;
      await cache.query(space, randomVector(), { endUserId: "a" }, 1);
      await cache.loaded();
    }
    // Nine partial reloads kept the copy's a-7 (its fingerprint did not change)...
    expect((await top()).similarity).toBeLessThan(0.99);
    const fetched = chromaStore.fetched;
    clock += 30_000;
    await cache.query(space, randomVector(), { endUserId: "a" }, 1);
    await cache.loaded();
    // ...and the tenth read them all.
    expect(chromaStore.fetched - fetched).toBe(300);
    expect(await top()).toMatchObject({ id: "a-7" });
    expect((await top()).similarity).toBeCloseTo(1, 5);
    await cache.close();
  });

  it("leaves to Chroma a user who does not fit in the memory given, or has too many vectors", async () => {
    for (const options of [{ maxBytes: 50_000 }, { maxPerUser: 100 }]) {
      const { chromaStore, cache } = cacheOver(options);
      const { space } = await corpus(cache);
      await cache.query(space, randomVector(), { endUserId: "a" }, 1);
      await cache.loaded();
      expect(cache.stats().users).toBe(0);
      // And does not read them again at every search.
      await cache.query(space, randomVector(), { endUserId: "a" }, 1);
      await cache.loaded();
      expect(cache.stats().users).toBe(0);
      expect(chromaStore.queries).toBe(2);
      expect(chromaStore.loads).toBe(1);
      // The small user fits.
      await cache.query(space, randomVector(), { endUserId: "b" }, 1);
      await cache.loaded();
      expect(cache.stats()).toMatchObject({ users: 1, vectors: 50 });
      await cache.close();
    }
  });
});
