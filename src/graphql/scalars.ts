import { GraphQLError, Kind } from "graphql";
import { GraphQLSafeInt } from "graphql-scalars";
import { builder } from "../builder.ts";
import { DATE_TIME_RULE, isoDateTime } from "../limits.ts";

function toDate(value: unknown): Date {
  const date = isoDateTime(value);
  if (!date) throw new GraphQLError(`DateTime must be ${DATE_TIME_RULE}.`, { extensions: { code: "BAD_USER_INPUT" } });
  return date;
}

builder.scalarType("DateTime", {
  description: "An ISO-8601 date-time (UTC when given without an offset), always returned in UTC.",
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
