import { builder } from "../builder.ts";
import { EntrySource, JobStatus, Role, Scope } from "../generated/prisma/client.ts";

export const ScopeEnum = builder.enumType(Scope, { name: "Scope" });
export const EntrySourceEnum = builder.enumType(EntrySource, { name: "EntrySource" });
export const RoleEnum = builder.enumType(Role, { name: "Role" });
export const JobStatusEnum = builder.enumType(JobStatus, { name: "JobStatus" });
