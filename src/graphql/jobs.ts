import { builder } from "../builder.ts";
import { LIMITS } from "../limits.ts";
import { JobStatusEnum } from "./enums.ts";

builder.prismaObject("JobRun", {
  description: "One run of a background job for this tenant.",
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    status: t.expose("status", { type: JobStatusEnum }),
    result: t.expose("result", { type: "JSON", nullable: true }),
    error: t.exposeString("error", { nullable: true }),
    startedAt: t.expose("startedAt", { type: "DateTime" }),
    finishedAt: t.expose("finishedAt", { type: "DateTime", nullable: true }),
  }),
});

builder.queryFields((t) => ({
  jobRuns: t.prismaField({
    type: ["JobRun"],
    authScopes: { reader: true },
    description: "What ran, when and with what result, newest first.",
    args: { name: t.arg.string(), first: t.arg.int({ defaultValue: 20 }) },
    resolve: (query, _root, args, ctx) =>
      ctx.db.jobRun.findMany({
        ...query,
        where: args.name ? { name: args.name } : {},
        orderBy: [{ startedAt: "desc" }, { id: "desc" }],
        take: Math.min(Math.max(args.first ?? 20, 1), LIMITS.pageMax),
      }),
  }),
}));

builder.subscriptionFields((t) => ({
  jobRunChanged: t.prismaField({
    type: "JobRun",
    authScopes: { reader: true },
    description: "Job runs as they start and finish.",
    subscribe: (_root, _args, ctx) =>
      ctx.deps.pubsub.subscribe("jobRunChanged", ctx.principal.tenantId),
    resolve: (query, run, _args, ctx) =>
      ctx.db.jobRun.findUniqueOrThrow({ ...query, where: { id: run.id } }),
  }),
}));
