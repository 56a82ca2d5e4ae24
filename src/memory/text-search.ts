import { Prisma } from "../generated/prisma/client.ts";

/**
 * A condition true when a tsvector holds every word of at least one of the phrases (English
 * stemming, so "my addresses" finds "address"). For forgetting what a user names.
 */
export function matchesAnyPhrase(vector: Prisma.Sql, phrases: string[]): Prisma.Sql {
  return Prisma.sql`${vector} @@ ANY (
    SELECT to_tsquery('english', array_to_string(tsvector_to_array(to_tsvector('english', p)), ' & '))
    FROM unnest(${phrases}::text[]) AS p
    WHERE numnode(to_tsquery('english', array_to_string(tsvector_to_array(to_tsvector('english', p)), ' & '))) > 0
  )`;
}
