import type { CodegenConfig } from "@graphql-codegen/cli";

// schema/schema.graphql is printed from the Pothos schema (npm run schema:print); the typed
// documents for schema/operations/*.graphql are what tests, the CLI and the inspector use.
const config: CodegenConfig = {
  schema: "schema/schema.graphql",
  documents: ["schema/operations/**/*.graphql"],
  generates: {
    "src/gql/": {
      preset: "client",
      config: {
        scalars: { DateTime: "string", JSON: "unknown", SafeInt: "number" },
        enumsAsTypes: true,
        useTypeImports: true,
        emitLegacyCommonJSImports: false,
      },
      presetConfig: { fragmentMasking: false },
    },
  },
};

export default config;
