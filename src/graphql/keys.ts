import {
  getDirectiveValues,
  GraphQLIncludeDirective,
  GraphQLSkipDirective,
  Kind,
  type GraphQLResolveInfo,
  type SelectionNode,
  type SelectionSetNode,
} from "graphql";
import { builder } from "../builder.ts";
import { badInput, notFound } from "../errors.ts";
import { createApiKey, revokeApiKey } from "../governance/keys.ts";
import { RoleEnum } from "./enums.ts";

builder.prismaObject("ApiKey", {
  description: "An API key's record; the key itself is shown once, when created, and never stored.",
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    role: t.expose("role", { type: RoleEnum }),
    prefix: t.exposeString("prefix", { description: "The key's first characters, to recognise it." }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    revokedAt: t.expose("revokedAt", { type: "DateTime", nullable: true }),
  }),
});

builder.prismaObject("Tenant", {
  fields: (t) => ({ id: t.exposeID("id"), name: t.exposeString("name") }),
});

const Viewer = builder.objectRef<{ tenantId: string; apiKeyId: string; role: "ADMIN" | "WRITER" | "READER" }>("Viewer").implement({
  description: "Who is calling: the key's tenant and role.",
  fields: (t) => ({
    role: t.field({ type: RoleEnum, resolve: (v) => v.role }),
    apiKeyId: t.exposeID("apiKeyId"),
    tenant: t.prismaField({
      type: "Tenant",
      resolve: (query, v, _args, ctx) =>
        ctx.db.tenant.findUniqueOrThrow({ ...query, where: { id: v.tenantId } }),
    }),
  }),
});

const CreatedApiKey = builder.simpleObject("CreatedApiKey", {
  fields: (t) => ({
    key: t.string({ description: "The secret: shown this once only." }),
    id: t.id(),
    role: t.field({ type: RoleEnum }),
  }),
});

builder.queryFields((t) => ({
  viewer: t.field({
    type: Viewer,
    authScopes: { reader: true },
    resolve: (_root, _args, ctx) => ctx.principal,
  }),
  apiKeys: t.prismaField({
    type: ["ApiKey"],
    authScopes: { admin: true },
    resolve: (query, _root, _args, ctx) =>
      ctx.db.apiKey.findMany({ ...query, orderBy: { createdAt: "asc" } }),
  }),
}));

builder.mutationFields((t) => ({
  createApiKey: t.field({
    type: CreatedApiKey,
    authScopes: { admin: true },
    args: { role: t.arg({ type: RoleEnum, required: true }), name: t.arg.string() },
    resolve: async (_root, { role, name }, ctx, info) => {
      // The key is shown only in this answer: one asked for without it would be live and lost.
      if (!selects(info, "key")) throw badInput("Select `key` in createApiKey's answer: the key is shown only there, never again.");
      const { key, apiKey } = await createApiKey(ctx.db, { role, name: name ?? "" }, { apiKeyId: ctx.principal.apiKeyId, via: "graphql" });
      return { key, id: apiKey.id, role: apiKey.role };
    },
  }),
  revokeApiKey: t.prismaField({
    type: "ApiKey",
    authScopes: { admin: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (query, _root, { id }, ctx) => {
      const key = await revokeApiKey(ctx.db, String(id), ctx.deps, { apiKeyId: ctx.principal.apiKeyId, via: "graphql" });
      return ctx.db.apiKey.findUniqueOrThrow({ ...query, where: { id: key.id } });
    },
  }),
}));

/** Whether the field's selection asks for `name` (directly, or through a fragment), not skipped by @skip or @include. */
function selects(info: GraphQLResolveInfo, name: string): boolean {
  // As graphql-js's execution decides it.
  const kept = (node: SelectionNode) =>
    getDirectiveValues(GraphQLSkipDirective, node, info.variableValues)?.if !== true &&
    getDirectiveValues(GraphQLIncludeDirective, node, info.variableValues)?.if !== false;
  const within = (set: SelectionSetNode | undefined): boolean =>
    (set?.selections ?? []).some((selection) => {
      if (!kept(selection)) return false;
      if (selection.kind === Kind.FIELD) return selection.name.value === name;
      if (selection.kind === Kind.INLINE_FRAGMENT) return within(selection.selectionSet);
      return within(info.fragments[selection.name.value]?.selectionSet);
    });
  return info.fieldNodes.some((node) => within(node.selectionSet));
}
