/** What a recall snippet's vector is filed with, so searches can filter without the database. */
export type SnippetVector = {
  id: string;
  vector: number[];
  endUserId: string;
  conversationId: string;
  kind: "TURN" | "SUMMARY" | "FACT";
  occurredAt: Date;
  /**
   * The fingerprint (`vectorVersion`): when read back from the store, the one it was stored with
   * (absent for a vector stored before Engram kept one); when writing, computed if not given.
   */
  version?: number;
};

export type VectorHit = { id: string; similarity: number };

/** Vectors live per tenant and embedding model: a search never crosses either. */
export type VectorSpace = { tenantId: string; model: string };

/** Deletes by ids and/or metadata; the conditions given all apply. */
export type VectorSelector = {
  ids?: string[];
  endUserId?: string;
  conversationId?: string;
  occurredBefore?: Date;
};

/** The vector store behind recall (Chroma); small enough to fake in a test. */
export type VectorStore = {
  upsert(space: VectorSpace, vectors: SnippetVector[]): Promise<void>;
  /** The k nearest of one end user's vectors, optionally leaving one conversation out. */
  query(
    space: VectorSpace,
    vector: number[],
    filter: { endUserId: string; excludeConversationId?: string | null },
    k: number,
  ): Promise<VectorHit[]>;
  /**
   * One end user's vector ids in the space, each with the fingerprint it was stored with (the
   * vector cache reads again only those that changed), or null when they are more than `limit`.
   */
  versionsOf(space: VectorSpace, endUserId: string, limit: number): Promise<Map<string, number | undefined> | null>;
  /** A page of the space's vector ids, in the store's own order (the orphan sweep walks them). */
  idsPage(space: VectorSpace, offset: number, limit: number): Promise<string[]>;
  /** These vectors of the space that exist, with their metadata. */
  vectorsByIds(space: VectorSpace, ids: string[]): Promise<SnippetVector[]>;
  /** Deletes in every embedding model's collection of the tenant. */
  delete(tenantId: string, selector: VectorSelector): Promise<void>;
  /** Which of these snippets have a vector in the space. */
  present(space: VectorSpace, ids: string[]): Promise<Set<string>>;
  /** How many vectors match (tests and checks). */
  count(tenantId: string, selector: VectorSelector): Promise<number>;
  close(): Promise<void>;
};
