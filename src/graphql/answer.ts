/** Rows a write has in hand: a relation's row by name, with the rows of its own relations below it. */
export type KnownRows = { [relation: string]: { row: object; relations?: KnownRows } };

/**
 * A mutation's answer through plugin-prisma: the row the write returned when the selection asks
 * only for the row's own fields (the plugin's `query` is then empty), or also for relations the
 * write has in hand (`known`: the turn's conversation with its agent and end user), each with all
 * its fields (the plugin's `include: { relation: true }`); else (a `select`, a list, a relation not
 * in hand) a re-read with the selection's relations (one statement: the client joins them).
 */
export function rowOrReread<T extends object>(query: object, row: T, reread: () => Promise<T>, known: KnownRows = {}): T | Promise<T> {
  return (fromKnown(query, row, known) as T | null) ?? reread();
}

function fromKnown(query: object, row: object, known: KnownRows): object | null {
  const keys = Object.keys(query);
  if (keys.length === 0) return row;
  if (keys.length !== 1 || keys[0] !== "include") return null;
  const include = (query as { include: Record<string, unknown> }).include;
  const answer: Record<string, unknown> = { ...row };
  for (const [relation, nested] of Object.entries(include)) {
    const have = known[relation];
    if (!have) return null;
    if (nested === true) answer[relation] = have.row;
    else if (nested && typeof nested === "object") {
      const deeper = fromKnown(nested, have.row, have.relations ?? {});
      if (!deeper) return null;
      answer[relation] = deeper;
    } else return null;
  }
  return answer;
}
