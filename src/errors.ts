import { ZodError } from "zod";
import { TimedOut } from "./timeout.ts";

export type ErrorCode =
  | "UNAUTHENTICATED"
  | "FORBIDDEN"
  | "NOT_FOUND"
  | "BAD_USER_INPUT"
  | "CONFLICT"
  | "MODEL_UNAVAILABLE"
  | "VECTOR_STORE_UNAVAILABLE"
  | "BUDGET_EXHAUSTED"
  | "MODEL_CALL_LIMIT"
  | "REDACTION_FAILED"
  | "EXPORT_TOO_LARGE"
  | "SUBSCRIBER_TOO_SLOW";

/** An expected failure: reaches the caller with its code; anything else stays masked. */
export class EngramError extends Error {
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details?: Record<string, unknown>,
  ) {
    super(message);
    this.name = "EngramError";
  }
}

/**
 * What a stored record (a job run, a compaction's failed bucket) may say of an error, which
 * readers see: an Engram error's own words and a timeout's, which are written for them; for a
 * model answer that could not be read, only that (the answer repeats what users said); anything
 * else (a driver's or a client's message, which may name hosts, paths or SQL) only that it
 * failed, or `what` failed. The whole error goes to the server's log.
 */
export function publicReason(error: unknown, what = "failed unexpectedly"): string {
  if (error instanceof EngramError || error instanceof TimedOut) return error.message;
  // LangChain's OutputParserException (its name stays "Error"; its code says what it is).
  if ((error as { lc_error_code?: string } | null)?.lc_error_code === "OUTPUT_PARSING_FAILURE") return "the model's answer could not be read";
  return `${what} (the server's log has the error)`;
}

export const notFound = (what: string, id?: string) =>
  new EngramError("NOT_FOUND", id ? `${what} ${id} was not found.` : `${what} was not found.`);

export const badInput = (message: string, details?: Record<string, unknown>) =>
  new EngramError("BAD_USER_INPUT", message, details);

/** Validates input at the edge with one zod schema; failures become BAD_USER_INPUT. */
export function parseInput<T>(schema: { parse(input: unknown): T }, input: unknown): T {
  try {
    return schema.parse(input);
  } catch (error) {
    if (error instanceof ZodError) {
      const issues = error.issues.map((issue) => ({
        path: issue.path.join("."),
        message: issue.message,
      }));
      throw badInput(
        `Invalid input: ${issues.map((i) => (i.path ? `${i.path}: ${i.message}` : i.message)).join("; ")}`,
        { issues },
      );
    }
    throw error;
  }
}
