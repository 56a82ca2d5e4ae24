import SchemaBuilder from "@pothos/core";
import PrismaPlugin from "@pothos/plugin-prisma";
import RelayPlugin from "@pothos/plugin-relay";
import ScopeAuthPlugin from "@pothos/plugin-scope-auth";
import SimpleObjectsPlugin from "@pothos/plugin-simple-objects";
import { GraphQLError } from "graphql";
import { forTenant, type TenantDb } from "./db.ts";
import type { PrismaClient } from "./generated/prisma/client.ts";
import PrismaTypes, { getDatamodel } from "./generated/pothos-types.ts";
import type { Principal } from "./governance/keys.ts";
import type { Services } from "./services.ts";

export type Context = { principal: Principal; services: Services };

/** The tenant-scoped client for this request's caller: the only client resolvers use. */
export const tenantDb = (ctx: Context): TenantDb => forTenant(ctx.services.db, ctx.principal.tenantId);

export const builder = new SchemaBuilder<{
  Context: Context;
  PrismaTypes: PrismaTypes;
  AuthScopes: { reader: boolean; writer: boolean; admin: boolean };
  DefaultFieldNullability: false;
  Scalars: {
    DateTime: { Input: Date; Output: Date | string };
    JSON: { Input: unknown; Output: unknown };
  };
}>({
  plugins: [ScopeAuthPlugin, PrismaPlugin, RelayPlugin, SimpleObjectsPlugin],
  defaultFieldNullability: false,
  prisma: {
    client: (ctx) => tenantDb(ctx) as unknown as PrismaClient,
    dmmf: getDatamodel(),
    filterConnectionTotalCount: true,
    onUnusedQuery: "warn",
  },
  relay: { clientMutationId: "omit", cursorType: "String" },
  scopeAuth: {
    authorizeOnSubscribe: true,
    authScopes: (ctx) => ({
      reader: true,
      writer: ctx.principal.role !== "READER",
      admin: ctx.principal.role === "ADMIN",
    }),
    unauthorizedError: (_parent, _context, _info, result) =>
      new GraphQLError(result.message || "This key's role may not do that.", {
        extensions: { code: "FORBIDDEN" },
      }),
  },
});

builder.queryType({});
builder.mutationType({});
builder.subscriptionType({});
