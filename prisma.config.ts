import { PrismaPg } from "@prisma/adapter-pg";
import { defineConfig } from "prisma/config";

// Engram applies its committed migrations itself at start-up (src/embedded/migrate.ts), so the CLI is
// only used offline: `prisma generate` and `prisma migrate diff` (README, "Authoring a migration").
// engine "js" keeps the CLI on its WASM engines: nothing is downloaded.
export default defineConfig({
  schema: "prisma/schema.prisma",
  experimental: { adapter: true },
  engine: "js",
  adapter: async () =>
    new PrismaPg({
      connectionString: process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres",
      allowExitOnIdle: true,
    }),
});
