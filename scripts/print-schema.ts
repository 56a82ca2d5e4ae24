// Prints the Pothos schema to schema/schema.graphql (a test fails when the file is stale).
import { writeFileSync } from "node:fs";
import { printedSchema } from "../src/graphql/index.ts";

writeFileSync(new URL("../schema/schema.graphql", import.meta.url), printedSchema());
