import { GraphQLError, Kind } from "graphql";
import { GraphQLSafeInt } from "graphql-scalars";
import { builder } from "../builder.ts";

// A four-digit year, a date, and optionally a time and an offset: what ISO-8601 and the store agree on.
const ISO_DATE_TIME = /^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?$/i;

function toDate(value: unknown): Date {
  const date =
    value instanceof Date ? value : typeof value === "string" && ISO_DATE_TIME.test(value) ? new Date(value) : null;
  if (!date || Number.isNaN(date.getTime()) || date.getUTCFullYear() < 1 || date.getUTCFullYear() > 9999) {
    throw new GraphQLError("DateTime must be an ISO-8601 date-time string between the years 0001 and 9999.", {
      extensions: { code: "BAD_USER_INPUT" },
    });
  }
  return date;
}

builder.scalarType("DateTime", {
  description: "An ISO-8601 date-time, always returned in UTC.",
  serialize: (value) => toDate(value).toISOString(),
  parseValue: toDate,
  parseLiteral: (ast) => toDate(ast.kind === Kind.STRING ? ast.value : null),
});

builder.scalarType("JSON", {
  description: "Any JSON value.",
  serialize: (value) => value,
  parseValue: (value) => value,
});

// Totals that outgrow a 32-bit Int (a tenant's tokens over its whole history): whole numbers up to 2^53 - 1.
builder.addScalarType("SafeInt", GraphQLSafeInt);
