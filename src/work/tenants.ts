import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";

export type ActiveTenant = Awaited<ReturnType<Deps["tenants"]["active"]>>[number];

/**
 * A sweep across tenants: `work` runs for each active tenant (or the one named), one after the
 * other, with that tenant's scoped client. One tenant's failure is logged and never stops the
 * others'. Returns what each run returned, leaving out failures and runs that returned nothing.
 */
export async function forEachTenant<T>(
  deps: Pick<Deps, "tenants" | "log">,
  what: string,
  work: (tenant: ActiveTenant, db: TenantDb) => Promise<T | undefined>,
  tenantId?: string,
): Promise<T[]> {
  const results: T[] = [];
  for (const tenant of await deps.tenants.active(tenantId)) {
    try {
      const result = await work(tenant, deps.tenants.scoped(tenant.id));
      if (result !== undefined) results.push(result);
    } catch (error) {
      deps.log.error(`${what} of a tenant failed; the others go on`, { tenantId: tenant.id, error });
    }
  }
  return results;
}
