import { z } from "zod";

// Input limits, documented in README ("Limits").
export const LIMITS = {
  titleMax: 200,
  bodyMaxChars: 64_000,
  summaryMaxChars: 32_000,
  tagsMax: 32,
  tagMaxChars: 64,
  scopeRefMaxChars: 200,
  kindMaxChars: 100,
  sourceMaxChars: 100,
  sourceRefMaxChars: 500,
  pageMax: 100,
  requestBodyBytes: 1_000_000,
  queryDepth: 10,
  queryCost: 50_000,
  aliases: 30,
  /** context and recall fields per request: each may spend model calls. */
  modelFieldsPerRequest: 3,
  /** contextTimeline fields per request: each tokenizes up to 200 turns of a conversation. */
  timelinesPerRequest: 1,
  /** exportUser fields per request: each may gather up to exportRowsMax rows into the reply. */
  exportsPerRequest: 1,
  /** exportUser's rows of history (messages, summary revisions, snippets, events); any size streams from GET /export/users/:id. */
  exportRowsMax: 5_000,
} as const;

export const scopeSchema = z.enum(["INSTITUTIONAL", "ENTITY", "PROJECT", "TEAM"]);
export const scopeRefSchema = z.string().trim().min(1).max(LIMITS.scopeRefMaxChars);
export const tagsSchema = z
  .array(z.string().trim().min(1).max(LIMITS.tagMaxChars))
  .max(LIMITS.tagsMax)
  .transform((tags) => [...new Set(tags)]);
export const pageSizeSchema = z.number().int().min(1).max(LIMITS.pageMax);

/** Why a text cannot be stored (PostgreSQL refuses NUL; lone surrogates are not Unicode), or null. */
export function textProblem(value: string): string | null {
  if (value.includes("\u0000")) return "holds a NUL character (\\u0000)";
  if (!(value as unknown as { isWellFormed(): boolean }).isWellFormed()) return "holds a lone UTF-16 surrogate";
  return null;
}

/** A fact's text, as the API takes it (addFact, correctFact) and MCP's remember checks it before writing anything. */
export const factTextSchema = z.string().trim().min(3).max(500);

export const MESSAGE_LIMITS = {
  messageMaxChars: 32_000,
  privateStepsMax: 50,
  importMessagesMax: 5_000,
} as const;
