import { Prisma } from "../../generated/prisma/client.ts";

/**
 * A CTE named `name` holding those of `messageIds` that are still there and not forgotten (`id`,
 * and `factsForgotten`: whether a fact from it was deleted), share-locked until the statement's
 * end, in id order as the forgets lock them. Whatever a statement writes from messages it read
 * earlier (a snippet, a gate verdict, a fact) is written only from the ids this CTE returns: a forget
 * that marked or deleted the messages meanwhile leaves it nothing, and one under way waits for
 * the write and then sweeps it.
 */
export function liveMessages(name: string, tenantId: string, messageIds: string[]): Prisma.Sql {
  return Prisma.sql`${Prisma.raw(`"${name}"`)} AS (
      SELECT m."id", m."factsForgottenAt" IS NOT NULL AS "factsForgotten" FROM "Message" m
      WHERE m."tenantId" = ${tenantId} AND m."id" = ANY(${messageIds}::text[]) AND m."forgottenAt" IS NULL
      ORDER BY m."id"
      FOR SHARE
    )`;
}
