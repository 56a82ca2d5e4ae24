import type { TenantDb } from "../db.ts";
import { notFound } from "../errors.ts";

/**
 * What the log holds about a person as an entity: scope ENTITY under their own external id (a
 * skill's notes on them). A team, project or agent that shares the id is another scope. The
 * export lists these entries; forgetting the person deletes them, their events and feed rows.
 */
export const aboutThePerson = (externalId: string) => ({ scope: "ENTITY" as const, scopeRef: externalId });

/**
 * Everything Engram holds about one person, as JSON: the right-of-access twin of forgetting.
 * Facts with their history, each conversation with its messages (those forgotten but kept as a
 * record too, marked), its summary and revisions, the recall snippets' text, and the events and
 * curated entries about them as an entity (aboutThePerson).
 */
export async function exportUser(db: TenantDb, endUserId: string) {
  const user = await db.endUser.findUnique({ where: { id: endUserId } });
  if (!user) throw notFound("End user", endUserId);
  const [facts, conversations, snippets, entries, events] = await Promise.all([
    db.fact.findMany({
      where: { endUserId },
      orderBy: [{ core: "desc" }, { confirmedAt: "desc" }],
      include: { versions: { orderBy: { createdAt: "asc" }, select: { text: true, core: true, change: true, reason: true, createdAt: true } } },
    }),
    db.conversation.findMany({
      where: { endUserId },
      orderBy: { createdAt: "asc" },
      select: {
        id: true,
        externalId: true,
        createdAt: true,
        lastSeq: true,
        summary: true,
        agent: { select: { externalId: true, name: true } },
        revisions: { orderBy: { createdAt: "asc" }, select: { text: true, accepted: true, reason: true, createdAt: true } },
        messages: { orderBy: { seq: "asc" }, select: { seq: true, role: true, content: true, private: true, occurredAt: true, forgottenAt: true } },
      },
    }),
    db.recallSnippet.findMany({
      where: { endUserId },
      orderBy: { occurredAt: "asc" },
      select: { id: true, kind: true, text: true, conversationId: true, occurredAt: true },
    }),
    db.memoryEntry.findMany({
      where: aboutThePerson(user.externalId),
      orderBy: { updatedAt: "desc" },
      select: { id: true, scope: true, scopeRef: true, title: true, summary: true, tags: true, importance: true, source: true, updatedAt: true },
    }),
    db.memoryEvent.findMany({
      where: aboutThePerson(user.externalId),
      orderBy: { occurredAt: "asc" },
      select: { id: true, scope: true, scopeRef: true, kind: true, body: true, source: true, sourceRef: true, occurredAt: true },
    }),
  ]);
  return {
    exportedAt: new Date().toISOString(),
    endUser: { id: user.id, externalId: user.externalId, displayName: user.displayName, createdAt: user.createdAt },
    facts: facts.map(({ tenantId: _t, ...fact }) => fact),
    conversations,
    snippets,
    entries,
    events,
  };
}
