/**
 * A mutation's answer through plugin-prisma: the row the write returned when the selection asks
 * only for the row's own fields (the plugin's `query` is then empty), else a
 * re-read with the selection's relations (one statement: the client joins them).
 */
export function rowOrReread<T>(query: object, row: T, reread: () => Promise<T>): T | Promise<T> {
  return Object.keys(query).length ? reread() : row;
}
