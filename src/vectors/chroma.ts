import { ChromaClient, type Collection, type Where } from "chromadb";
import type { Logger } from "../log.ts";
import type { ChromaServer } from "../embedded/chroma.ts";
import type { SnippetVector, VectorHit, VectorSelector, VectorSpace, VectorStore } from "./index.ts";

const PREFIX = "engram-";

function modelPart(model: string) {
  return model.toLowerCase().replace(/[^a-z0-9._-]+/g, "-").replace(/^[^a-z0-9]+|[^a-z0-9]+$/g, "") || "default";
}

/**
 * One collection per tenant, embedding model and end user. A search is always one end user's,
 * and Chroma filters metadata by scanning a collection: with one collection per tenant the
 * `endUserId` filter cost 21 ms of a 26 ms query at 10k vectors and 90 ms at 100k, against 5 ms
 * unfiltered (bench/README.md, "Recall latency"). Chroma names allow [a-zA-Z0-9._-], 3–512
 * characters, alphanumeric at both ends; ids are UUIDs.
 */
export function collectionName(space: VectorSpace, endUserId: string): string {
  return `${PREFIX}${space.tenantId}-${modelPart(space.model)}-${endUserId}`;
}

const epoch = (date: Date) => Math.floor(date.getTime() / 1000);

function whereOf(selector: Omit<VectorSelector, "ids">): Where | undefined {
  const clauses: Where[] = [
    ...(selector.endUserId ? [{ endUserId: selector.endUserId }] : []),
    ...(selector.conversationId ? [{ conversationId: selector.conversationId }] : []),
    ...(selector.occurredBefore ? [{ occurredAt: { $lt: epoch(selector.occurredBefore) } }] : []),
  ];
  if (clauses.length === 0) return undefined;
  return clauses.length === 1 ? clauses[0] : { $and: clauses };
}

/** Map.groupBy (Node 21+), for Node 20. */
function groupBy<T>(items: T[], key: (item: T) => string): Map<string, T[]> {
  const groups = new Map<string, T[]>();
  for (const item of items) {
    const group = groups.get(key(item));
    if (group) group.push(item);
    else groups.set(key(item), [item]);
  }
  return groups;
}

const isNotFound = (error: unknown) => (error as Error).name === "ChromaNotFoundError";
const HANDLES = 10_000;
const MOVE_PAGE = 500;
const UPSERTS_AT_ONCE = 4;

/**
 * Recall vectors in Chroma, with our own embeddings (`embeddingFunction: null`) and cosine
 * distance. `server()` resolves the Chroma to talk to; the embedded one is started on first use.
 * Collections of the earlier layout (one per tenant and model) are moved into per-user ones in
 * the background once this process touches their tenant; until then searches read them too.
 */
export function createChromaVectorStore(server: () => Promise<ChromaServer>, log: Logger): VectorStore {
  let client: { url: string; chroma: ChromaClient } | undefined;
  // Handles by name, most recently used last (a handle is a name and an id: no round trip to use).
  const collections = new Map<string, Collection>();
  // tenant -> the move of its earlier-layout collections (settled once done).
  const moves = new Map<string, { done: boolean; settled: Promise<void> }>();
  let earlierLayout: Promise<Collection[]> | undefined;

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
      moves.clear();
      earlierLayout = undefined;
    }
    return client.chroma;
  }

  function remember(found: Collection) {
    collections.delete(found.name);
    collections.set(found.name, found);
    if (collections.size > HANDLES) collections.delete(collections.keys().next().value!);
    return found;
  }

  /** The end user's collection; created when `create`, else null when it does not exist. */
  async function userCollection(space: VectorSpace, endUserId: string, create: true): Promise<Collection>;
  async function userCollection(space: VectorSpace, endUserId: string, create: false): Promise<Collection | null>;
  async function userCollection(space: VectorSpace, endUserId: string, create: boolean) {
    const name = collectionName(space, endUserId);
    const known = collections.get(name);
    if (known) return remember(known);
    const c = await chroma();
    if (create) {
      return remember(
        await c.getOrCreateCollection({
          name,
          embeddingFunction: null,
          configuration: { hnsw: { space: "cosine" } },
          metadata: { tenantId: space.tenantId, model: space.model, endUserId },
        }),
      );
    }
    try {
      return remember(await c.getCollection({ name }));
    } catch (error) {
      if (isNotFound(error)) return null;
      throw error;
    }
  }

  /** Runs work on the user's collection; one deleted behind our back (by another process) is looked up again, once. */
  async function onUserCollection<T>(space: VectorSpace, endUserId: string, create: boolean, work: (c: Collection | null) => Promise<T>) {
    const run = async () => work(create ? await userCollection(space, endUserId, true) : await userCollection(space, endUserId, false));
    try {
      return await run();
    } catch (error) {
      if (!isNotFound(error)) throw error;
      collections.delete(collectionName(space, endUserId));
      return run();
    }
  }

  /** Every collection whose name passes `keep`, paging through Chroma's list. */
  async function listCollections(keep: (c: Collection) => boolean): Promise<Collection[]> {
    const c = await chroma();
    const found: Collection[] = [];
    for (let offset = 0; ; offset += 100) {
      const page = await c.listCollections({ limit: 100, offset });
      found.push(...page.filter(keep));
      if (page.length < 100) return found;
    }
  }

  /**
   * The tenant's collections (of any model): one end user's and the earlier layout's when
   * `endUserId` is given. Deletes only: Chroma cannot list by prefix, so this pages through all.
   */
  function tenantCollections(tenantId: string, endUserId?: string): Promise<Collection[]> {
    const prefix = `${PREFIX}${tenantId}-`;
    return listCollections((col) => {
      if (!col.name.startsWith(prefix)) return false;
      const owner = col.metadata?.endUserId;
      return owner === undefined || endUserId === undefined || owner === endUserId;
    });
  }

  /** Every tenant's collections of the earlier layout (no `endUserId`), listed once per process. */
  function earlierLayoutCollections(): Promise<Collection[]> {
    if (!earlierLayout) {
      const listing = listCollections((col) => col.name.startsWith(PREFIX) && col.metadata?.endUserId === undefined);
      earlierLayout = listing;
      listing.catch(() => earlierLayout === listing && (earlierLayout = undefined));
    }
    return earlierLayout;
  }

  /** Moves one earlier-layout collection's vectors into per-user collections (resumable: upserts, then deletes). */
  async function moveCollection(legacy: Collection, tenantId: string) {
    const model = String(legacy.metadata?.model ?? "");
    let total = 0;
    for (;;) {
      const page = await legacy.get({ limit: MOVE_PAGE, include: ["embeddings", "metadatas"] });
      if (page.ids.length === 0) break;
      const rows = page.ids.map((_, i) => i);
      for (const [endUserId, mine] of groupBy(rows, (i) => String(page.metadatas[i]?.endUserId))) {
        const target = await userCollection({ tenantId, model }, endUserId, true);
        await target.upsert({
          ids: mine.map((i) => page.ids[i]),
          embeddings: mine.map((i) => page.embeddings[i] as number[]),
          metadatas: mine.map((i) => page.metadatas[i]!),
        });
      }
      await legacy.delete({ ids: page.ids });
      total += page.ids.length;
    }
    await (await chroma()).deleteCollection({ name: legacy.name });
    log.info("moved a collection's vectors into per-user collections", { collection: legacy.name, vectors: total });
  }

  /**
   * The move of the tenant's earlier-layout collections, started on the first call and run in
   * the background; searches do not wait for it, deletes do (a page read before a delete must
   * not bring a forgotten vector back). A failed move starts again on the next call.
   */
  function moveOf(tenantId: string) {
    let move = moves.get(tenantId);
    if (!move) {
      const started = { done: false, settled: Promise.resolve() };
      started.settled = (async () => {
        for (const legacy of await earlierLayoutCollections()) {
          if (!legacy.name.startsWith(`${PREFIX}${tenantId}-`)) continue;
          // Another process may have moved it meanwhile.
          await moveCollection(legacy, tenantId).catch((error) => {
            if (!isNotFound(error)) throw error;
          });
        }
        started.done = true;
      })();
      started.settled.catch((error) => {
        if (moves.get(tenantId) === started) moves.delete(tenantId);
        log.warn("could not move a tenant's vectors into per-user collections; trying again on the next call", { tenantId, error });
      });
      moves.set(tenantId, started);
      move = started;
    }
    return move;
  }

  /** The earlier layout's collections of this tenant and model while its move runs (searched with a filter). */
  async function notMovedYet(space: VectorSpace): Promise<Collection[]> {
    if (moveOf(space.tenantId).done) return [];
    const name = `${PREFIX}${space.tenantId}-${modelPart(space.model)}`;
    return (await earlierLayoutCollections()).filter((c) => c.name === name);
  }

  return {
    async upsert(space, vectors: SnippetVector[]) {
      if (vectors.length === 0) return;
      moveOf(space.tenantId);
      const writeOwn = ([endUserId, own]: [string, SnippetVector[]]) =>
        onUserCollection(space, endUserId, true, (c) =>
          c!.upsert({
            ids: own.map((v) => v.id),
            embeddings: own.map((v) => v.vector),
            metadatas: own.map((v) => ({
              endUserId: v.endUserId,
              conversationId: v.conversationId,
              kind: v.kind,
              occurredAt: epoch(v.occurredAt),
            })),
          }),
        );
      // A batch of many users' snippets: a few users' collections at a time.
      const groups = [...groupBy(vectors, (v) => v.endUserId)];
      for (let i = 0; i < groups.length; i += UPSERTS_AT_ONCE) await Promise.all(groups.slice(i, i + UPSERTS_AT_ONCE).map(writeOwn));
    },

    async query(space, vector, filter, k): Promise<VectorHit[]> {
      const excluded = filter.excludeConversationId ? { conversationId: { $ne: filter.excludeConversationId } } : undefined;
      // Distances only: the snippets are read back from the database anyway.
      const search = (c: Collection, where: Where | undefined) =>
        c.query({ queryEmbeddings: [vector], nResults: k, ...(where ? { where } : {}), include: ["distances"] });
      const legacies = await notMovedYet(space);
      const [own, ...earlier] = await Promise.all([
        onUserCollection(space, filter.endUserId, false, (c) => (c ? search(c, excluded) : Promise.resolve(null))),
        ...legacies.map((legacy) =>
          search(legacy, excluded ? { $and: [{ endUserId: filter.endUserId }, excluded] } : { endUserId: filter.endUserId }).catch((error) => {
            if (isNotFound(error)) return null; // moved meanwhile
            throw error;
          }),
        ),
      ]);
      const best = new Map<string, number>();
      for (const result of [own, ...earlier]) {
        const distances = result?.distances[0] ?? [];
        (result?.ids[0] ?? []).forEach((id, i) => {
          const similarity = 1 - (distances[i] ?? 1);
          if (similarity > (best.get(id) ?? -Infinity)) best.set(id, similarity);
        });
      }
      return [...best]
        .map(([id, similarity]) => ({ id, similarity }))
        .sort((a, b) => b.similarity - a.similarity)
        .slice(0, k);
    },

    async delete(tenantId, selector) {
      const where = whereOf(selector);
      if (!where && !selector.ids) throw new Error("Refusing to delete every vector of a tenant without a selector.");
      if (selector.ids && selector.ids.length === 0) return;
      await moveOf(tenantId).settled;
      const c = await chroma();
      const onlyTheUser = selector.endUserId && !selector.ids && !selector.conversationId && !selector.occurredBefore;
      for (const col of await tenantCollections(tenantId, selector.endUserId)) {
        if (onlyTheUser && col.metadata?.endUserId === selector.endUserId) {
          // Forgetting a person takes their collection, name and all.
          await c.deleteCollection({ name: col.name }).catch((error) => {
            if (!isNotFound(error)) throw error;
          });
          collections.delete(col.name);
        } else {
          await col.delete({ ...(selector.ids ? { ids: [...new Set(selector.ids)] } : {}), ...(where ? { where } : {}) }).catch((error) => {
            if (!isNotFound(error)) throw error;
          });
        }
        log.debug("deleted vectors", { collection: col.name, ...selector, ids: selector.ids?.length });
      }
    },

    async count(tenantId, selector) {
      await moveOf(tenantId).settled;
      const where = whereOf(selector);
      let total = 0;
      for (const c of await tenantCollections(tenantId, selector.endUserId)) {
        if (!where && !selector.ids) total += await c.count();
        else total += (await c.get({ ...(selector.ids ? { ids: selector.ids } : {}), ...(where ? { where } : {}), include: [] })).ids.length;
      }
      return total;
    },

    async close() {
      collections.clear();
      moves.clear();
      client = undefined;
    },
  };
}
