import { Prisma } from "../generated/prisma/client.ts";

/**
 * A tsquery of the English lexemes of a text joined by & or |; NULL when the text has none.
 * Each lexeme is quoted and cast, never parsed as query syntax, so any text (a URL with ':' and
 * '?', quotes, backslashes) is safe, and lexemes are not stemmed a second time.
 */
export function lexemeQuery(text: Prisma.Sql | string, operator: "&" | "|"): Prisma.Sql {
  return Prisma.sql`(
    SELECT string_agg('''' || replace(replace(l, '\\', '\\\\'), '''', '''''') || '''', ${Prisma.raw(`' ${operator} '`)})::tsquery
    FROM unnest(tsvector_to_array(to_tsvector('english', ${text}))) AS l
  )`;
}

/**
 * A condition true when a tsvector holds every word of at least one of the phrases (English
 * stemming, so "my addresses" finds "address"). For forgetting what a user names.
 */
export function matchesAnyPhrase(vector: Prisma.Sql, phrases: string[]): Prisma.Sql {
  return Prisma.sql`${vector} @@ ANY (
    SELECT q FROM (SELECT ${lexemeQuery(Prisma.sql`p`, "&")} AS q FROM unnest(${phrases}::text[]) AS p) queries
    WHERE q IS NOT NULL
  )`;
}
