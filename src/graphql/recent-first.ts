import { resolveCursorConnection, type DefaultConnectionArguments } from "@pothos/plugin-relay";
import { badInput } from "../errors.ts";
import { LIMITS } from "../limits.ts";

/** Where a row stood in a most-recently-updated-first list when its page was read. */
type Position = { updatedAt: Date; id: string };

// Ids are Prisma's (letters, digits, - and _): anything else is no cursor of ours.
const ISSUED = /^recent:(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) ([\w-]{1,100})$/;

/** The cursor of a row: its updatedAt and id as they were when the page was read. */
const toCursor = (row: Position) => Buffer.from(`recent:${row.updatedAt.toISOString()} ${row.id}`).toString("base64url");

function positionOf(name: "after" | "before", cursor: string): Position {
  const match = ISSUED.exec(Buffer.from(cursor, "base64url").toString("utf8"));
  const updatedAt = new Date(match?.[1] ?? NaN);
  // Year 0 and below the store cannot hold.
  if (!match || Number.isNaN(updatedAt.getTime()) || updatedAt.getUTCFullYear() < 1) {
    throw badInput(`\`${name}\` is not a cursor of this list: pass a page's ${name === "after" ? "endCursor" : "startCursor"}.`);
  }
  return { updatedAt, id: match[2] };
}

/** A side of a position, as a Prisma filter of any model with updatedAt and id. */
type Beyond = { OR: [{ updatedAt: { lt: Date } | { gt: Date } }, { updatedAt: Date; id: { lt: string } | { gt: string } }] };

/** The rows after a position, most recent first, and those before it. */
const olderThan = ({ updatedAt, id }: Position): Beyond => ({ OR: [{ updatedAt: { lt: updatedAt } }, { updatedAt, id: { lt: id } }] });
const newerThan = ({ updatedAt, id }: Position): Beyond => ({ OR: [{ updatedAt: { gt: updatedAt } }, { updatedAt, id: { gt: id } }] });

/**
 * A connection of rows most recently updated first (conversations, end users), paged by where the
 * last row of a page stood when that page was read. Prisma's cursor (the row's id) placed the next
 * page after that row as it is now: a conversation with a new turn since went to the top, and the
 * next page began again from there, repeating the first one (the inspector's "More
 * conversations" while agents talk). A row updated between two pages moves ahead of the pages
 * read and is not shown again; no other row is repeated or skipped.
 */
export function recentFirst<T extends Position>(
  args: DefaultConnectionArguments,
  find: (page: { where: { AND: Beyond[] }; orderBy: [{ updatedAt: "asc" | "desc" }, { id: "asc" | "desc" }]; take: number }) => Promise<T[]>,
) {
  return resolveCursorConnection<Promise<T[]>>({ args, toCursor, maxSize: LIMITS.pageMax }, ({ after, before, limit, inverted }) => {
    const AND = [...(after ? [olderThan(positionOf("after", after))] : []), ...(before ? [newerThan(positionOf("before", before))] : [])];
    const direction = inverted ? "asc" : "desc";
    return find({ where: { AND }, orderBy: [{ updatedAt: direction }, { id: direction }], take: limit });
  });
}
