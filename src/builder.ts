import SchemaBuilder from "@pothos/core";
import PrismaPlugin from "@pothos/plugin-prisma";
import RelayPlugin from "@pothos/plugin-relay";
import ScopeAuthPlugin from "@pothos/plugin-scope-auth";
import SimpleObjectsPlugin from "@pothos/plugin-simple-objects";
import { GraphQLError } from "graphql";
import type { TenantDb } from "./db.ts";
import type { Deps } from "./deps.ts";
import type { PrismaClient } from "./generated/prisma/client.ts";
import PrismaTypes, { getDatamodel } from "./generated/pothos-types.ts";
import type { Principal } from "./governance/keys.ts";

/**
 * A request's context: who is calling, the client scoped to their tenant (the only client
 * resolvers see), and the dependencies resolvers hand to domain and work functions.
 */
export type GraphQLContext = { principal: Principal; db: TenantDb; deps: Deps };

export const builder = new SchemaBuilder<{
  Context: GraphQLContext;
  PrismaTypes: PrismaTypes;
  AuthScopes: { reader: boolean; writer: boolean; admin: boolean };
  DefaultFieldNullability: false;
  Scalars: {
    DateTime: { Input: Date; Output: Date | string };
    JSON: { Input: unknown; Output: unknown };
    SafeInt: { Input: number; Output: number };
  };
}>({
  plugins: [ScopeAuthPlugin, PrismaPlugin, RelayPlugin, SimpleObjectsPlugin],
  defaultFieldNullability: false,
  prisma: {
    client: (ctx) => ctx.db as unknown as PrismaClient,
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
    // Says which role the field takes and which this key has: Pothos's own message only named the field.
    unauthorizedError: (_parent, context, info, result) => {
      const needed = scopesIn(result.failure);
      const role = needed.includes("writer") ? "a writer or admin key" : needed.includes("admin") ? "an admin key" : null;
      const message = role
        ? `${info.parentType.name}.${info.fieldName} takes ${role}; this is a ${context.principal.role.toLowerCase()} key.`
        : result.message || "This key's role may not do that.";
      return new GraphQLError(message, { extensions: { code: "FORBIDDEN" } });
    },
  },
});

builder.queryType({});
builder.mutationType({});
builder.subscriptionType({});

/** The scopes (reader, writer, admin) a refused field asked for, from scope-auth's failure. */
function scopesIn(failure: { kind: string; scope?: unknown; failures?: unknown[] }): string[] {
  if (typeof failure.scope === "string") return [failure.scope];
  return (failure.failures ?? []).flatMap((f) => scopesIn(f as typeof failure));
}
