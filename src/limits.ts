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

/** Where in `value` (an input's path) a text, or a key, cannot be stored (textProblem), or null. */
export function findTextProblem(value: unknown, path: string, depth = 0): string | null {
  if (typeof value === "string") {
    const problem = textProblem(value);
    return problem ? `${path} ${problem}` : null;
  }
  if (depth > 64 || value === null || typeof value !== "object") return null;
  for (const [key, inner] of Object.entries(value)) {
    const keyProblem = textProblem(key);
    if (keyProblem) return `a key in ${path} ${keyProblem}`;
    const problem = findTextProblem(inner, Array.isArray(value) ? `${path}[${key}]` : `${path}.${key}`, depth + 1);
    if (problem) return problem;
  }
  return null;
}

// A four-digit year, a date, and optionally a time and an offset: what ISO-8601 and the store agree on.
const ISO_DATE_TIME = /^(\d{4})-(\d{2})-(\d{2})(?:([T ])(\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?)(Z|[+-]\d{2}(?::?\d{2})?)?)?$/i;

const daysIn = (year: number, month: number) =>
  month === 2 ? (year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0) ? 29 : 28) : [4, 6, 9, 11].includes(month) ? 30 : 31;

export const DATE_TIME_RULE = "an ISO-8601 date-time string between the years 0001 and 9999 (UTC when it has no offset)";

/**
 * An ISO-8601 date-time as the API takes it (the DateTime scalar, `engram import`), or null. A
 * time without an offset is UTC, not the local time of whichever machine reads it; a day the
 * month does not have is refused (Date reads 2026-02-30 as 2 March).
 */
export function isoDateTime(value: unknown): Date | null {
  let date: Date | null = null;
  if (value instanceof Date) date = value;
  else if (typeof value === "string") {
    const match = ISO_DATE_TIME.exec(value);
    if (!match) return null;
    const [, year, month, day, , time, offset] = match;
    if (+month < 1 || +month > 12 || +day < 1 || +day > daysIn(+year, +month)) return null;
    date = new Date(time ? `${year}-${month}-${day}T${time}${offset ?? "Z"}` : value);
  }
  if (!date || Number.isNaN(date.getTime()) || date.getUTCFullYear() < 1 || date.getUTCFullYear() > 9999) return null;
  return date;
}

/** How far ahead of this server's clock a caller's clock may be. */
export const CLOCK_SKEW_MS = 86_400_000;

/**
 * When something happened (a message, an event), for a backfill: not later than now, give or take
 * a day of clock skew. Retention and compaction act on what is older than their window by this
 * time, so a moment dated years ahead (a typo, a clock gone wrong) would be kept until then,
 * whatever the window.
 */
export const pastMomentSchema = z
  .date()
  .refine((date) => date.getTime() <= Date.now() + CLOCK_SKEW_MS, "is in the future: more than a day ahead of this server's clock");

/** A fact's text, as the API takes it (addFact, correctFact) and MCP's remember checks it before writing anything. */
export const factTextSchema = z.string().trim().min(3).max(500);

export const MESSAGE_LIMITS = {
  messageMaxChars: 32_000,
  privateStepsMax: 50,
  importMessagesMax: 5_000,
} as const;
