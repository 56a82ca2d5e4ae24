import { createHash } from "node:crypto";
import type { Runnable } from "@langchain/core/runnables";
import { OutputParserException } from "@langchain/core/output_parsers";
import { unreadable } from "../../chains/json.ts";
import {
  GATE_INSTRUCTIONS,
  gateVerdictJsonSchema,
  gateVerdictSchema,
  normalizeVerdict,
  type GateVerdict,
  type TriageInput,
  type TriageVerdict,
} from "../../chains/triage.ts";
import { appNow, type TenantDb } from "../../db.ts";
import type { GateVerdict as GateVerdictRow } from "../../generated/prisma/client.ts";
import { EngramError, parseInput } from "../../errors.ts";
import type { Logger } from "../../log.ts";
import { builtInValues } from "../../governance/redaction.ts";
import { ModelCallError } from "../../models/egress.ts";
import { liveMessages } from "../conversations/live-messages.ts";
import { needsRecallByKeywords } from "./keywords.ts";

export type StoredVerdict = TriageVerdict & { decidedBy: "MODEL" | "KEYWORDS" | "CALLER" };

type VerdictRow = Pick<GateVerdictRow, "remember" | "forget" | "forgetTargets" | "needsRecall" | "decidedBy">;

/** A verdict as the gate stored it. */
function storedVerdict(row: VerdictRow): StoredVerdict {
  return {
    remember: row.remember,
    forget: row.forget as TriageVerdict["forget"],
    forgetTargets: row.forgetTargets,
    needsRecall: row.needsRecall,
    decidedBy: row.decidedBy as StoredVerdict["decidedBy"],
  };
}

export type { GateVerdict };

/** What an agent runtime appends to its own model call so the gate rides on it (gateInstructions). */
export function gateInstructions() {
  return { prompt: GATE_INSTRUCTIONS, jsonSchema: gateVerdictJsonSchema(), toolName: "engram_gate" };
}

/** A caller's verdict: the schema gateInstructions serves, with "SOME" of nothing read as "NONE". */
export const callerVerdictSchema = gateVerdictSchema.transform(normalizeVerdict);

/** Checks a caller's verdict (BAD_USER_INPUT when it does not fit the schema). */
export function parseCallerVerdict(gate: unknown): GateVerdict {
  return parseInput(callerVerdictSchema, gate);
}

/**
 * Stores the verdict the caller's own model gave on a message. It replaces any stored one (the
 * caller saw the whole turn), and the background gate never overwrites it: gateMessage reads
 * the stored verdict first and only ever inserts.
 */
export async function storeCallerVerdict(
  db: TenantDb,
  input: { conversationId: string; message: string; verdict: GateVerdict },
) {
  const messageHash = messageHashOf(input.message);
  const fields = { ...input.verdict, decidedBy: "CALLER" };
  await db.gateVerdict.upsert({
    where: { conversationId_messageHash: { conversationId: input.conversationId, messageHash } },
    create: { tenantId: db.$tenantId(), conversationId: input.conversationId, messageHash, ...fields },
    // Dated afresh: retention keeps a verdict the window's length from when it was last given.
    update: { ...fields, createdAt: new Date() },
  });
}

/** What a stored verdict is keyed by: the message's text, hashed. */
export const messageHashOf = (message: string) => createHash("sha256").update(message.trim()).digest("hex");

// Without a model, only a request phrased as one counts: "forget" opening a sentence (after an
// optional "please"/"can you"), never "don't forget …" or "did you forget …?". Then "forget my X"
// forgets X, "forget everything about X" forgets X (unless X is "me"), and any other "forget
// everything/all …" ("… about me and my wife", "… I said", "… we talked about") forgets all.
const REQUEST = String.raw`(?:^|[.!;:\n]\s*)(?:(?:please|pls|ok|okay|now|and|so)[,\s]+)*(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?)?forget\s+`;
const FORGET_ALL = new RegExp(`${REQUEST}(?:everything|all)\\b`, "i");
// "everything about me" is all: whose, not what.
const ALL_ABOUT_ME = new RegExp(`${REQUEST}(?:everything|all)(?:\\s+(?:that\\s+)?you\\s+know)?\\s+about\\s+me\\b`, "i");
const FORGET_SOME = new RegExp(`${REQUEST}(?:that\\s+|about\\s+)?(?:all\\s+(?:of\\s+)?|everything\\s+(?:about\\s+)?)?((?:my|the|that)\\b[^.!?\\n]{1,120})`, "i");
// "Forget everything (I said) about cycling": a topic, named without my/the/that.
const FORGET_TOPIC = new RegExp(
  `${REQUEST}(?:everything|all)(?:\\s+(?:that\\s+)?(?:i|you|we)(?:\\s+[a-z']+){1,2})?\\s+about\\s+(?!me\\b)([^.!?\\n]{1,120})`,
  "i",
);
// A phrase takes only what holds every one of its words (forget.ts): the words a request goes on
// with that name nothing ("…, thanks", "the code I gave you") are left out, and a list ("my
// address and my phone number") is one phrase per thing. "And"/"or" part things only before a
// new "my/the/that": "my work or home address" is one thing, as is "the black and white photo".
const NAMING_NOTHING = /\b(?:please|pls|thanks|thank|kindly|i|you|told|gave|given|said|mentioned|shared|sent|earlier|before|previously|yesterday|now|again|too|also|anymore|ok|okay)\b/gi;
const thingsNamed = (named: string) =>
  named
    .split(/\s*(?:[,;&]|\b(?:and|or)\b(?=\s+(?:my|the|that)\b))\s*/i)
    .map((thing) => thing.replace(NAMING_NOTHING, " ").replace(/\s+/g, " ").trim())
    .filter((thing) => thing && !/^(?:and|or)$/i.test(thing));

/**
 * The keyword gate used when no model is configured (or the model's answer is unreadable):
 * it never decides to remember (the extractor needs a model anyway), catches explicit requests
 * to forget, and asks for recall on the phrases of recall-gate.ts.
 */
export function keywordGate(message: string): TriageVerdict {
  const request = message.trim();
  // A question about forgetting ("did you forget …?") is not a request to forget; "can you
  // forget …?" is.
  const politeRequest = /^(?:please\s+)?(?:can|could|would|will)\s+you\s+(?:please\s+)?forget\b/i.test(request);
  if (request.endsWith("?") && !politeRequest) {
    return { remember: false, forget: "NONE", forgetTargets: [], needsRecall: needsRecallByKeywords(message) };
  }
  const all = { remember: false, forget: "ALL" as const, forgetTargets: [], needsRecall: false };
  if (ALL_ABOUT_ME.test(request)) return all;
  const named = thingsNamed((FORGET_SOME.exec(request) ?? FORGET_TOPIC.exec(request))?.[1] ?? "");
  if (named.length) return { remember: false, forget: "SOME", forgetTargets: named, needsRecall: needsRecallByKeywords(message) };
  if (FORGET_ALL.test(request)) return all;
  return { remember: false, forget: "NONE", forgetTargets: [], needsRecall: needsRecallByKeywords(message) };
}

/** A placeholder as redaction writes them: a built-in one, or a tenant's own in its usual form. */
const PLACEHOLDER = /\[[A-Z][A-Z0-9_ -]{0,40}\]/g;
/** As many things to forget as the model may name (triage's schema). */
const MAX_TARGETS = 20;

/**
 * The model judged the message as redaction left it, so a thing to forget may name a placeholder
 * ("my email [EMAIL]"), and a phrase holding the word alone would take every message that says
 * "email". Each built-in placeholder is put back as what it stood for in this message, one phrase
 * per value. A placeholder this message gives no value for (a tenant's own pattern's, whose
 * matches are not read back here) cannot be: left out, the phrase would name too much ("[EMPLOYEE_ID]
 * badge": every message saying "badge"), so the keyword gate, which reads the message itself,
 * names the thing instead ("my badge E-4471"), or nothing is named by that phrase.
 */
export function unredacted(targets: string[], message: string): string[] {
  if (!targets.some((target) => target.match(PLACEHOLDER))) return targets;
  const values = builtInValues(message);
  let byKeywords: string[] | undefined;
  // Lazily, and from each placeholder's distinct values: a target naming a placeholder k times
  // stands for (values)^k phrases, which built whole ran a process out of memory.
  function* expand(target: string): Generator<string> {
    const placeholder = [...target.matchAll(PLACEHOLDER)].map((m) => m[0]).find((p) => !message.includes(p));
    if (!placeholder) return yield target;
    const stoodFor = values.get(placeholder);
    if (!stoodFor) return yield* (byKeywords ??= keywordGate(message).forgetTargets);
    for (const value of new Set(stoodFor)) yield* expand(target.replace(placeholder, () => value));
  }
  const phrases = new Set<string>();
  let tried = 0;
  for (const target of targets) {
    for (const expanded of expand(target)) {
      const phrase = expanded.replace(/\s+/g, " ").trim();
      if (/[\p{L}\p{N}]/u.test(phrase)) phrases.add(phrase);
      // A message full of addresses is not a list of thousands.
      if (phrases.size === MAX_TARGETS || ++tried === MAX_TARGETS * 50) return [...phrases];
    }
  }
  return [...phrases];
}

/** The verdict stored for a message of a conversation (the caller's, or an earlier gate's), if any. */
export async function storedGateVerdict(db: TenantDb, input: { conversationId: string; message: string }): Promise<StoredVerdict | null> {
  const row = await db.gateVerdict.findUnique({
    where: { conversationId_messageHash: { conversationId: input.conversationId, messageHash: messageHashOf(input.message) } },
  });
  return row ? storedVerdict(row) : null;
}

/**
 * The per-turn gate, run after the reply by the turn's background work: one verdict per user
 * message, stored. A verdict the caller gave (context or recordTurn with `gate`) is stored
 * already and is used as it is: no model call.
 */
export async function gateMessage(
  db: TenantDb,
  deps: { triage: Runnable<TriageInput, TriageVerdict> | null; log: Logger },
  input: { conversationId: string; messageId: string; message: string },
): Promise<StoredVerdict> {
  const messageHash = messageHashOf(input.message);
  const cached = await storedGateVerdict(db, input);
  if (cached) return cached;
  let verdict: StoredVerdict = { ...keywordGate(input.message), decidedBy: "KEYWORDS" };
  if (deps.triage) {
    try {
      const judged = await deps.triage.invoke({ message: input.message });
      verdict = { ...normalizeVerdict({ ...judged, forgetTargets: unredacted(judged.forgetTargets, input.message) }), decidedBy: "MODEL" };
    } catch (error) {
      // An unreadable answer, a spent budget, a broken route or a request the provider refuses
      // (a message too long for a small model's context): the keyword gate decides, so a "forget"
      // request is never held back by the model, nor the conversation's later turns, which are
      // judged in order, by one message. An outage throws, and the job retries.
      const outage = error instanceof ModelCallError && error.kind === "failed";
      if (outage || (!(error instanceof OutputParserException) && !(error instanceof EngramError))) throw error;
      const unread = error instanceof OutputParserException;
      deps.log.warn(`gate: ${unread ? "the model's answer could not be read" : error.message}; using the keyword gate`, {
        conversationId: input.conversationId,
        ...(unread ? unreadable(error) : {}),
      });
    }
  }
  // Stored only while the message is there and not forgotten (a forget may have run during the
  // model call): a verdict keeps the message's hash and what it asked to forget.
  const tenantId = db.$tenantId();
  const stored = await db.$queryRaw<{ id: string }[]>`
    WITH ${liveMessages("judged", tenantId, [input.messageId])}
    INSERT INTO "GateVerdict" ("id", "tenantId", "conversationId", "messageHash", "remember", "forget", "forgetTargets", "needsRecall", "decidedBy", "createdAt")
    SELECT gen_random_uuid()::text, ${tenantId}, ${input.conversationId}, ${messageHash}, ${verdict.remember}, ${verdict.forget},
           ${verdict.forgetTargets}::text[], ${verdict.needsRecall}, ${verdict.decidedBy}, ${appNow()}
    WHERE EXISTS (SELECT 1 FROM "judged")
    ON CONFLICT ("conversationId", "messageHash") DO NOTHING
    RETURNING "id"`;
  if (stored.length) return verdict;
  // A concurrent call stored its verdict first: everyone gets that one. Or the message was
  // forgotten: the verdict is used, not kept.
  const first = await db.gateVerdict.findUnique({
    where: { conversationId_messageHash: { conversationId: input.conversationId, messageHash } },
  });
  return first ? storedVerdict(first) : verdict;
}

/**
 * The gate of many user messages at once where no model is to decide (the agent's extraction is
 * off): a stored verdict (the caller's) as it is, else the keyword gate's. One read for the whole
 * batch; the verdicts come back in the order of the messages, with the rows still to store (the
 * caller writes them with the rest of its batch: work/follow-ups.ts).
 */
export async function gateByKeywords(
  db: TenantDb,
  messages: { conversationId: string; message: string }[],
): Promise<{ verdicts: StoredVerdict[]; fresh: (Omit<GateVerdictRow, "id" | "tenantId" | "createdAt"> & { index: number })[] }> {
  if (messages.length === 0) return { verdicts: [], fresh: [] };
  const hashes = messages.map((m) => messageHashOf(m.message));
  const stored = await db.gateVerdict.findMany({
    where: { OR: messages.map((m, i) => ({ conversationId: m.conversationId, messageHash: hashes[i] })) },
  });
  const byKey = new Map(stored.map((v) => [`${v.conversationId}:${v.messageHash}`, v]));
  const verdicts = messages.map((m, i): StoredVerdict => {
    const found = byKey.get(`${m.conversationId}:${hashes[i]}`);
    return found ? storedVerdict(found) : { ...keywordGate(m.message), decidedBy: "KEYWORDS" };
  });
  const fresh = messages.flatMap((m, i) =>
    byKey.has(`${m.conversationId}:${hashes[i]}`) ? [] : [{ index: i, conversationId: m.conversationId, messageHash: hashes[i], ...verdicts[i] }],
  );
  return { verdicts, fresh };
}
