import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";

export type ActiveTenant = Awaited<ReturnType<Deps["tenants"]["active"]>>[number];

/** A tenant whose run of a sweep threw, with what it threw. */
export type TenantFailure = { tenantId: string; error: unknown };

/** What a sweep across tenants gave: each run's result (runs that returned nothing left out), and the runs that threw. */
export type TenantSweep<T> = { done: T[]; failed: TenantFailure[] };

/**
 * A sweep across tenants: `work` runs for each active tenant (or the one named), one after the
 * other, with that tenant's scoped client. One tenant's failure is logged and never stops the
 * others'; the caller learns of it in `failed` (to retry it, or to say so).
 */
export async function forEachTenant<T>(
  deps: Pick<Deps, "tenants" | "log">,
  what: string,
  work: (tenant: ActiveTenant, db: TenantDb) => Promise<T | undefined>,
  tenantId?: string,
): Promise<TenantSweep<T>> {
  const sweep: TenantSweep<T> = { done: [], failed: [] };
  for (const tenant of await deps.tenants.active(tenantId)) {
    try {
      const result = await work(tenant, deps.tenants.scoped(tenant.id));
      if (result !== undefined) sweep.done.push(result);
    } catch (error) {
      deps.log.error(`${what} of a tenant failed; the others go on`, { tenantId: tenant.id, error });
      sweep.failed.push({ tenantId: tenant.id, error });
    }
  }
  return sweep;
}
