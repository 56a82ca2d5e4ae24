/**
 * Engram's layer rules (README "Where things live"); `npm run check:layers` fails when one breaks.
 * Type-only imports count: a type is a dependency too.
 */
const RAW_CLIENT_HOLDERS = "^src/(app|server|cli|services|auth|db)\\.ts$";

module.exports = {
  forbidden: [
    {
      name: "no-cycles",
      severity: "error",
      comment: "No import cycles, type-only ones included.",
      from: { path: "^(src|jobs|bin)/" },
      to: { circular: true },
    },
    {
      name: "src-never-imports-jobs",
      severity: "error",
      comment: "jobs/ are thin wrappers over src/work; src/ never reaches up into them, nor into bin/, the entry points that compose both.",
      from: { path: "^src/" },
      to: { path: "^(jobs|bin)/" },
    },
    {
      name: "one-entry-starts-the-worker",
      severity: "error",
      comment: "bin/server.ts, the process's composition root, hands jobs/worker.ts's startWorker to src/server.ts's runServer.",
      from: { path: "^(src|jobs|bin)/", pathNot: "^bin/server\\.ts$" },
      to: { path: "^jobs/worker\\.ts$" },
    },
    {
      name: "graphql-calls-the-domain",
      severity: "error",
      comment: "Resolvers call work/, memory/, governance/ or auth; models, chains, vectors and stores are the domain's business.",
      from: { path: "^src/graphql/" },
      to: { path: "^src/(chains|models|vectors|embeddings|embedded)/|^src/(services|agenda-queue|server|cli|app)\\.ts$" },
    },
    {
      name: "infrastructure-imports-no-domain",
      severity: "error",
      comment: "pubsub, db, errors, queue and log know nothing of the memory shapes.",
      from: { path: "^src/(pubsub|db|errors|queue|log|env|deps)\\.ts$" },
      to: { path: "^src/(memory|work|governance|graphql|chains)/" },
    },
    {
      name: "no-raw-client",
      severity: "error",
      comment: "Only the composition roots hold the unscoped Prisma client (services.ts builds it).",
      from: { path: "^(src|jobs|bin)/", pathNot: RAW_CLIENT_HOLDERS },
      to: { path: "^src/services\\.ts$" },
    },
    {
      name: "domain-never-imports-graphql",
      severity: "error",
      from: { path: "^src/(memory|work|governance|chains|models|vectors|embeddings)/" },
      to: { path: "^src/(graphql/|builder\\.ts$)" },
    },
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    exclude: { path: "^src/generated/|^src/gql/" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: { extensions: [".ts", ".tsx", ".mjs", ".js"] },
  },
};
