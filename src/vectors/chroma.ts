import { ChromaClient, type Collection, type Where } from "chromadb";
import type { Logger } from "../log.ts";
import { TimedOut, withTimeout } from "../timeout.ts";
import type { ChromaServer } from "../embedded/chroma.ts";
import type { SnippetVector, VectorHit, VectorSelector, VectorSpace, VectorStore } from "./index.ts";

const PREFIX = "engram-";

/** Chroma names allow [a-zA-Z0-9._-], 3–512 characters, alphanumeric at both ends. */
export function collectionName(space: VectorSpace): string {
  const model = space.model.toLowerCase().replace(/[^a-z0-9._-]+/g, "-").replace(/^[^a-z0-9]+|[^a-z0-9]+$/g, "");
  return `${PREFIX}${space.tenantId}-${model || "default"}`;
}

/** A time as Chroma's `occurredAt` metadata holds it: whole seconds since the epoch. */
export const epoch = (date: Date) => Math.floor(date.getTime() / 1000);

/**
 * A fingerprint of what is stored for a vector: its values (as the float32 Chroma keeps) and its
 * metadata, FNV-1a over their bytes. Kept as the vector's `v` metadata, so a reader holding a copy
 * can tell, from the metadata alone, which vectors changed since it read them.
 */
export function vectorVersion(v: Pick<SnippetVector, "vector" | "endUserId" | "conversationId" | "kind" | "occurredAt">): number {
  let hash = 0x811c9dc5;
  const mix = (byte: number) => {
    hash = Math.imul(hash ^ byte, 0x01000193);
  };
  for (const byte of new Uint8Array(Float32Array.from(v.vector).buffer)) mix(byte);
  const text = `${v.endUserId}\u0000${v.conversationId}\u0000${v.kind}\u0000${epoch(v.occurredAt)}`;
  for (let i = 0; i < text.length; i++) {
    const unit = text.charCodeAt(i);
    mix(unit & 0xff);
    mix(unit >> 8);
  }
  return hash >>> 0;
}

type Metadata = { endUserId: string; conversationId: string; kind: SnippetVector["kind"]; occurredAt: number; v?: number };
// Vectors per request when they are read by id (the vector cache's loads and catch-ups).
const VECTOR_PAGE = 250;
// How long the callers of a collection's open (writes, the vector cache's loads) wait for it,
// after which the next caller starts another. A search waits only as long as its own timeout
// allows; the open goes on without it, and keeps the handle for the searches after it.
const OPEN_TIMEOUT_MS = 45_000;
// After a search ran out of time, how many search timeouts pass before Chroma is searched again.
const QUIET_TIMEOUTS = 3;
// How long a delete waits for Chroma (a delete by metadata takes about 90 ms at 10,000 vectors),
// and, once one has run out, how long the deletes after it are refused at once.
const DELETE_TIMEOUT_MS = 10_000;

function whereOf(selector: Omit<VectorSelector, "ids">): Where | undefined {
  const clauses: Where[] = [
    ...(selector.endUserId ? [{ endUserId: selector.endUserId }] : []),
    ...(selector.conversationId ? [{ conversationId: selector.conversationId }] : []),
    ...(selector.occurredBefore ? [{ occurredAt: { $lt: epoch(selector.occurredBefore) } }] : []),
  ];
  if (clauses.length === 0) return undefined;
  return clauses.length === 1 ? clauses[0] : { $and: clauses };
}

/**
 * Recall vectors in Chroma, with our own embeddings (`embeddingFunction: null`) and cosine
 * distance. `server()` resolves the Chroma to talk to; the embedded one is started on first use.
 * A search waits at most `searchTimeoutMs` in all, reaching Chroma and opening the collection
 * included (a Chroma that hangs instead of refusing would hold every recall, and the reply of
 * every agent waiting on `context`, for as long as it hangs). Once one has run out, searches of
 * that collection are refused at once for three timeouts (or until an open of it under way
 * finishes), then one search at a time tries again until one answers: recall answers from
 * keywords without waiting meanwhile, and searches do not pile up, unanswered, on a Chroma that
 * hangs.
 */
export function createChromaVectorStore(
  server: () => Promise<ChromaServer>,
  log: Logger,
  options: { searchTimeoutMs?: number } = {},
): VectorStore {
  const searchTimeoutMs = options.searchTimeoutMs ?? 5_000;
  // Per collection: one tenant's collection that does not answer leaves the others searched.
  const quiet = new Map<string, { until: number; trying: boolean }>();
  let client: { url: string; chroma: ChromaClient } | undefined;
  let deletesQuietUntil = 0;
  const collections = new Map<string, Collection>();
  // Opens under way, by collection: the searches, loads and writes that need one share it.
  const opening = new Map<string, Promise<Collection>>();

  async function chroma(): Promise<ChromaClient> {
    const { url } = await server();
    if (client?.url !== url) {
      const parsed = new URL(url);
      client = {
        url,
        chroma: new ChromaClient({
          host: parsed.hostname,
          port: Number(parsed.port || (parsed.protocol === "https:" ? 443 : 80)),
          ssl: parsed.protocol === "https:",
        }),
      };
      collections.clear();
      opening.clear();
    }
    return client.chroma;
  }

  async function collection(space: VectorSpace): Promise<Collection> {
    const name = collectionName(space);
    const c = await chroma();
    const found = collections.get(name);
    if (found) return found;
    const pending = opening.get(name);
    if (pending) return pending;
    const opened = c
      .getOrCreateCollection({
        name,
        embeddingFunction: null,
        configuration: { hnsw: { space: "cosine" } },
        metadata: { tenantId: space.tenantId, model: space.model },
      })
      .then((handle) => {
        if (client?.chroma !== c) return handle;
        collections.set(name, handle);
        // Chroma answers again: a quiet period this open started ends, and the next search tries it.
        const state = quiet.get(name);
        if (state) state.until = Math.min(state.until, Date.now());
        return handle;
      });
    const open = withTimeout(opened, OPEN_TIMEOUT_MS, `Chroma did not open the collection within ${OPEN_TIMEOUT_MS / 1000} s`);
    opening.set(name, open);
    // Its callers hear how it ended; a search that stopped waiting does not.
    void open.catch(() => undefined).finally(() => opening.get(name) === open && opening.delete(name));
    return open;
  }

  /** Every collection of the tenant, whatever embedding model filled it. */
  async function tenantCollections(tenantId: string): Promise<Collection[]> {
    const c = await chroma();
    const prefix = `${PREFIX}${tenantId}-`;
    const found: Collection[] = [];
    for (let offset = 0; ; offset += 100) {
      const page = await c.listCollections({ limit: 100, offset });
      found.push(...page.filter((col) => col.name.startsWith(prefix)));
      if (page.length < 100) return found;
    }
  }

  // A collection deleted or recreated behind our back: forget the handle and go again once.
  async function withCollection<T>(space: VectorSpace, work: (c: Collection) => Promise<T>): Promise<T> {
    try {
      return await work(await collection(space));
    } catch (error) {
      if ((error as Error).name !== "ChromaNotFoundError") throw error;
      collections.delete(collectionName(space));
      return work(await collection(space));
    }
  }

  // In pages by id: each answer is parsed on the event loop (about 6 KB of JSON a 512-d vector),
  // so a user's thousands of vectors never hold it for long at once.
  async function vectorsByIds(space: VectorSpace, ids: string[]): Promise<SnippetVector[]> {
    const vectors: SnippetVector[] = [];
    for (let at = 0; at < ids.length; at += VECTOR_PAGE) {
      const page = await withCollection(space, (c) =>
        c.get<Metadata>({
          ids: ids.slice(at, at + VECTOR_PAGE),
          include: ["embeddings", "metadatas"],
        }),
      );
      page.ids.forEach((id, i) => {
        const meta = page.metadatas[i]!;
        vectors.push({
          id,
          vector: page.embeddings[i],
          endUserId: meta.endUserId,
          conversationId: meta.conversationId,
          kind: meta.kind,
          occurredAt: new Date(meta.occurredAt * 1000),
          version: meta.v,
        });
      });
    }
    return vectors;
  }

  return {
    async upsert(space, vectors: SnippetVector[]) {
      if (vectors.length === 0) return;
      await withCollection(space, (c) =>
        c.upsert({
          ids: vectors.map((v) => v.id),
          embeddings: vectors.map((v) => v.vector),
          metadatas: vectors.map((v) => ({
            endUserId: v.endUserId,
            conversationId: v.conversationId,
            kind: v.kind,
            occurredAt: epoch(v.occurredAt),
            v: v.version ?? vectorVersion(v),
          })),
        }),
      );
    },

    async query(space, vector, filter, k): Promise<VectorHit[]> {
      const where: Where = filter.excludeConversationId
        ? { $and: [{ endUserId: filter.endUserId }, { conversationId: { $ne: filter.excludeConversationId } }] }
        : { endUserId: filter.endUserId };
      // Distances only: the snippets are read back from the database anyway (about 2 ms less a query).
      // One deadline for reaching Chroma, opening the collection and searching it: an embedded
      // Chroma still starting, or an open still under way, goes on, and a later search uses it.
      const hung = `Chroma gave no answer within ${searchTimeoutMs} ms`;
      const name = collectionName(space);
      const state = quiet.get(name);
      if (state && (Date.now() < state.until || state.trying)) throw new TimedOut(`${hung} to a recent search; not searched again yet`);
      // Past a quiet period, this search is the one trial until it settles.
      if (state) state.trying = true;
      let result;
      try {
        result = await withTimeout(
          withCollection(space, (c) => c.query({ queryEmbeddings: [vector], nResults: k, where, include: ["distances"] })),
          searchTimeoutMs,
          hung,
        );
        quiet.delete(name);
      } catch (error) {
        if (error instanceof TimedOut) quiet.set(name, { until: Date.now() + QUIET_TIMEOUTS * searchTimeoutMs, trying: false });
        else if (state) state.trying = false;
        throw error;
      }
      const distances = result.distances[0] ?? [];
      return (result.ids[0] ?? []).map((id, i) => ({ id, similarity: 1 - (distances[i] ?? 1) }));
    },

    async versionsOf(space, endUserId, limit) {
      const { ids, metadatas } = await withCollection(space, (c) =>
        c.get<Metadata>({ where: { endUserId }, limit: limit + 1, include: ["metadatas"] }),
      );
      if (ids.length > limit) return null;
      return new Map(ids.map((id, i) => [id, metadatas[i]?.v]));
    },

    vectorsByIds,

    async idsPage(space, offset, limit) {
      return (await withCollection(space, (c) => c.get({ offset, limit, include: [] }))).ids;
    },

    // Bounded, as a search is: a forget (and a correction, which drops a key) deletes vectors on
    // the caller's request, and owes them to a job when the store does not take them; a Chroma
    // that hangs instead of refusing held every such request for as long as it hung.
    async delete(tenantId, selector) {
      const where = whereOf(selector);
      if (!where && !selector.ids) throw new Error("Refusing to delete every vector of a tenant without a selector.");
      if (selector.ids && selector.ids.length === 0) return;
      const hung = `Chroma gave no answer to a delete within ${DELETE_TIMEOUT_MS / 1000} s`;
      if (Date.now() < deletesQuietUntil) throw new TimedOut(`${hung} just before; not asked again yet`);
      const deleteAll = async () => {
        for (const c of await tenantCollections(tenantId)) {
          await c.delete({ ...(selector.ids ? { ids: [...new Set(selector.ids)] } : {}), ...(where ? { where } : {}) });
          log.debug("deleted vectors", { collection: c.name, ...selector, ids: selector.ids?.length });
        }
      };
      const work = deleteAll();
      try {
        await withTimeout(work, DELETE_TIMEOUT_MS, hung);
      } catch (error) {
        if (error instanceof TimedOut) {
          // The forget's other deletes are not held as long again: they are owed at once, until
          // this one is answered after all (Chroma is back) or the quiet period ends.
          const quietUntil = (deletesQuietUntil = Date.now() + DELETE_TIMEOUT_MS);
          void work.then(
            () => deletesQuietUntil === quietUntil && (deletesQuietUntil = 0),
            () => undefined,
          );
        }
        throw error;
      }
    },

    async present(space, ids) {
      if (ids.length === 0) return new Set();
      const found = await withCollection(space, (c) => c.get({ ids: [...new Set(ids)], include: [] }));
      return new Set(found.ids);
    },

    async count(tenantId, selector) {
      const where = whereOf(selector);
      let total = 0;
      for (const c of await tenantCollections(tenantId)) {
        if (!where && !selector.ids) total += await c.count();
        else total += (await c.get({ ...(selector.ids ? { ids: selector.ids } : {}), ...(where ? { where } : {}), include: [] })).ids.length;
      }
      return total;
    },

    async close() {
      collections.clear();
      client = undefined;
    },
  };
}
