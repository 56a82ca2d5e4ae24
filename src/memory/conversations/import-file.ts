import { createReadStream } from "node:fs";
import { createInterface } from "node:readline";
import type { TenantDb } from "../../db.ts";
import { importConversation } from "./turns.ts";

export type ImportLineResult = { line: number; conversationId?: string; messages?: number; error?: string };

async function* lines(file: string) {
  const reader = createInterface({ input: createReadStream(file, "utf8"), crlfDelay: Infinity });
  let n = 0;
  for await (const text of reader) {
    n++;
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
 * Backfills conversations from a JSONL file, one conversation per line:
 * {agentExternalId, endUserExternalId, conversationExternalId, messages: [{role, content, occurredAt}]}.
 * A bad line is reported and skipped; the others are imported (each into a new conversation).
 */
export async function* importJsonl(
  tenantDb: TenantDb,
  file: string,
  after: (imported: Awaited<ReturnType<typeof importConversation>>) => Promise<unknown>,
): AsyncGenerator<ImportLineResult> {
  for await (const { n, text } of lines(file)) {
    try {
      const raw = JSON.parse(text) as Record<string, unknown> & { messages?: Record<string, unknown>[] };
      const messages = (Array.isArray(raw.messages) ? raw.messages : []).map((m) => ({
        ...m,
        role: typeof m.role === "string" ? m.role.toUpperCase() : m.role,
        occurredAt: m.occurredAt ? new Date(String(m.occurredAt)) : null,
      }));
      const imported = await importConversation(tenantDb, { ...raw, messages } as never);
      await after(imported);
      yield { line: n, conversationId: imported.conversation.id, messages: messages.length };
    } catch (error) {
      yield { line: n, error: (error as Error).message };
    }
  }
}
