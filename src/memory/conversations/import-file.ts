import { createReadStream } from "node:fs";
import { createInterface } from "node:readline";
import type { TenantDb } from "../../db.ts";
import { badInput } from "../../errors.ts";
import { DATE_TIME_RULE, findTextProblem, isoDateTime } from "../../limits.ts";
import { importConversation } from "./turns.ts";

export type ImportLineResult = {
  line: number;
  conversationId?: string;
  messages?: number;
  /** The line had been imported before, with these messages: nothing was written again. */
  already?: boolean;
  error?: string;
};

async function* lines(file: string) {
  const reader = createInterface({ input: createReadStream(file, "utf8"), crlfDelay: Infinity });
  let n = 0;
  for await (const read of reader) {
    n++;
    // A byte-order mark, as Windows editors and PowerShell's Out-File write one, is not the first line's JSON.
    const text = n === 1 && read.startsWith("\uFEFF") ? read.slice(1) : read;
    if (text.trim()) yield { n, text };
  }
}

/** How many conversations a JSONL file holds (its non-blank lines), for a progress bar. */
export async function countLines(file: string): Promise<number> {
  let count = 0;
  for await (const _ of lines(file)) count++;
  return count;
}

/**
 * One line as importConversation takes it, read as the API reads its input: roles in any case,
 * each occurredAt an ISO-8601 date-time (UTC without an offset) or absent, and no text the store
 * cannot hold (the API's edge refuses these before importConversation: edge.ts, scalars.ts).
 * Anything else is the line's error, before anything is written.
 */
function importOfLine(text: string): Parameters<typeof importConversation>[1] {
  const raw: unknown = JSON.parse(text);
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) throw badInput("a line must be one JSON object");
  const textProblem = findTextProblem(raw, "the line");
  if (textProblem) throw badInput(textProblem);
  const line = raw as Record<string, unknown>;
  const messages = (Array.isArray(line.messages) ? line.messages : []).map((m: unknown, i) => {
    if (m === null || typeof m !== "object" || Array.isArray(m)) throw badInput(`messages[${i}] must be an object`);
    const message = m as Record<string, unknown>;
    let occurredAt: Date | null = null;
    if (message.occurredAt != null) {
      occurredAt = isoDateTime(message.occurredAt);
      if (!occurredAt) throw badInput(`messages[${i}].occurredAt must be ${DATE_TIME_RULE}, not ${JSON.stringify(message.occurredAt)}`);
    }
    return { ...message, role: typeof message.role === "string" ? message.role.toUpperCase() : message.role, occurredAt };
  });
  return { ...line, messages } as never;
}

/**
 * Backfills conversations from a JSONL file, one conversation per line:
 * {agentExternalId, endUserExternalId, conversationExternalId, messages: [{role, content, occurredAt}]}.
 * A bad line is reported and skipped; the others are imported (each into a new conversation). A
 * line imported before is left as it is, so a file can be imported again after an interruption.
 */
export async function* importJsonl(
  tenantDb: TenantDb,
  file: string,
  after: (imported: Awaited<ReturnType<typeof importConversation>>) => Promise<unknown>,
): AsyncGenerator<ImportLineResult> {
  for await (const { n, text } of lines(file)) {
    try {
      const input = importOfLine(text);
      const imported = await importConversation(tenantDb, input);
      await after(imported);
      yield imported.created
        ? { line: n, conversationId: imported.conversation.id, messages: input.messages.length }
        : { line: n, conversationId: imported.conversation.id, already: true };
    } catch (error) {
      yield { line: n, error: (error as Error).message };
    }
  }
}
