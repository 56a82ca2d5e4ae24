import { fileURLToPath } from "node:url";
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

const here = (path: string) => fileURLToPath(new URL(path, import.meta.url));

/** The inspector: built into web/dist and served by Engram at /inspector. */
export default defineConfig({
  root: here("."),
  // Relative, so the page works under any prefix; the server points a deep path's page at them.
  base: "./",
  plugins: [react()],
  // The typed documents that codegen writes for schema/operations/*.graphql.
  resolve: { alias: { "@gql": here("../src/gql") } },
  build: { outDir: here("dist"), emptyOutDir: true, chunkSizeWarningLimit: 1000 },
  logLevel: "warn",
});
