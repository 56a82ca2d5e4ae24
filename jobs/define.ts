import type { z } from "zod";

/** A job's name and payload schema, shared by whoever enqueues it and the worker that runs it. */
export type JobDefinition<S extends z.ZodType> = { name: string; schema: S };

export function defineJob<S extends z.ZodType>(definition: JobDefinition<S>): JobDefinition<S> {
  return definition;
}
