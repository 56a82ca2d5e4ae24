import { lexicographicSortSchema, printSchema } from "graphql";
import { builder } from "../builder.ts";
import "./scalars.ts";
import "./enums.ts";
import "./events.ts";
import "./entries.ts";
import "./keys.ts";
import "./usage.ts";
import "./settings.ts";
import "./jobs.ts";
import "./agents.ts";
import "./conversations.ts";
import "./context.ts";
import "./gate.ts";
import "./facts.ts";
import "./recall.ts";
import "./feed.ts";
import "./search.ts";

export const schema = builder.toSchema();

export const printedSchema = () => `${printSchema(lexicographicSortSchema(schema))}\n`;
