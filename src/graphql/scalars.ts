import { GraphQLError, Kind } from "graphql";
import { builder } from "../builder.ts";

function toDate(value: unknown): Date {
  const date = typeof value === "string" || value instanceof Date ? new Date(value) : null;
  if (!date || Number.isNaN(date.getTime())) {
    throw new GraphQLError("DateTime must be an ISO-8601 date-time string.", {
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
