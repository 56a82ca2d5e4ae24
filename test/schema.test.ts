import { readFileSync } from "node:fs";
import { generate } from "@graphql-codegen/cli";
import { describe, expect, it } from "vitest";
import config from "../codegen.ts";
import { printedSchema } from "../src/graphql/index.ts";

describe("schema", () => {
  it("schema/schema.graphql is the printed Pothos schema (run `npm run codegen` when this fails)", () => {
    expect(readFileSync(new URL("../schema/schema.graphql", import.meta.url), "utf8")).toBe(printedSchema());
  });

  it("the typed documents in src/gql match schema/operations (run `npm run codegen`)", async () => {
    const outputs = await generate({ ...config, silent: true, cwd: new URL("..", import.meta.url).pathname }, false);
    expect(outputs.length).toBeGreaterThan(0);
    for (const output of outputs) {
      expect(readFileSync(new URL(`../${output.filename}`, import.meta.url), "utf8"), output.filename).toBe(output.content);
    }
  });
});
