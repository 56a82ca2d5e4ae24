import type { Embeddings } from "@langchain/core/embeddings";
import type { EmbeddingsProvider } from "../../embeddings/index.ts";
import { OFFLINE_MODEL } from "../../embeddings/offline.ts";
import { isModelCallLimit } from "../../models/call-budget.ts";
import { needsRecallByKeywords } from "./keywords.ts";

/**
 * Sentences that ask for earlier conversations, in the ways users phrase it. A message close
 * enough to one of them needs recall even when no keyword of keywords.ts matches ("what's my
 * dog called?"). Written apart from the labelled sets of bench/recall-gate, so the measurement
 * is not a test on the training data.
 */
export const RECALL_PROTOTYPES = [
  "Same as last time, please.",
  "Can you reorder what I got before?",
  "What did we talk about in our previous conversation?",
  "Remind me what you recommended to me earlier.",
  "Do you remember what I told you about my family?",
  "Book the usual for me.",
  "Like we discussed the other day.",
  "What was the name of that place I mentioned before?",
  "Let's continue where we left off.",
  "Did I already tell you about my trip?",
  "What do you know about me?",
  "Which one did I pick last week?",
  "Go with my regular order.",
  "Use the same settings as before.",
  "You suggested something for this a while ago, what was it?",
  "What's my dog's name again?",
  "How is my project going since we last spoke?",
  "When is my appointment?",
] as const;

/**
 * Sentences that need nothing from earlier conversations: greetings and thanks, general
 * knowledge, tasks complete in themselves, news the user is telling now, and follow-ups on the
 * current conversation. A message needs recall only when it is closer to a recall prototype than
 * to these by a margin, so "Okay, sounds good." or "What's the capital of Peru?", which share
 * the recall prototypes' short question shape, stay out. Written apart from both labelled sets
 * of bench/recall-gate (held-out.json was written before these).
 */
export const NO_RECALL_PROTOTYPES = [
  "Hi, how are you?",
  "Thanks a lot!",
  "Okay.",
  "Goodbye.",
  "How far is the Moon from the Earth?",
  "How do I fix a flat bike tyre?",
  "Explain how photosynthesis works.",
  "Who painted the Mona Lisa?",
  "Write a short poem about the sea.",
  "Translate this sentence into French.",
  "Draft an email asking for a day off.",
  "Give me some ideas for a birthday party.",
  "I got a new phone today.",
  "My daughter starts school next week.",
  "Make that answer shorter.",
  "Can you explain your last point?",
  "Put it in a table.",
  "What does this error message mean?",
] as const;

/**
 * How much closer a message must be to the nearest recall prototype than to the nearest
 * no-recall one (cosine similarity) to need recall, per embedder: `margin` for any message, and
 * the lower `withKeywords` for one the keyword patterns match, whose words already point to an
 * earlier conversation (but "try again" or "what happened last week in the stock market?" also
 * match). Chosen together as the best F1 of the local gate on bench/recall-gate's labelled.json
 * for the offline encoder, and measured on its held-out.json (bench/README.md, "Recall gate");
 * other embedders have no measured margins, and there the keywords decide alone.
 */
export const RECALL_INTENT_MARGIN: Record<string, { margin: number; withKeywords: number }> = {
  [OFFLINE_MODEL]: { margin: -0.0125, withKeywords: -0.0375 },
};

const prototypes = new Map<string, Promise<{ recall: number[][]; other: number[][] }>>();

/** Both prototype sets' vectors for one embedder: embedded once per process and model, then cached. */
export function prototypeVectors(embeddings: Embeddings, model: string) {
  let vectors = prototypes.get(model);
  if (!vectors) {
    vectors = embeddings
      .embedDocuments([...RECALL_PROTOTYPES, ...NO_RECALL_PROTOTYPES])
      .then((all) => ({ recall: all.slice(0, RECALL_PROTOTYPES.length), other: all.slice(RECALL_PROTOTYPES.length) }));
    vectors.catch(() => prototypes.delete(model));
    prototypes.set(model, vectors);
  }
  return vectors;
}

function cosine(a: number[], b: number[]) {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return na && nb ? dot / Math.sqrt(na * nb) : 0;
}

/** A message vector's similarity to its nearest recall prototype and to its nearest no-recall one. */
export async function recallIntent(embeddings: Embeddings, model: string, vector: number[]) {
  const { recall, other } = await prototypeVectors(embeddings, model);
  const nearest = (set: number[][]) => Math.max(...set.map((p) => cosine(p, vector)));
  return { recall: nearest(recall), other: nearest(other) };
}

export type LocalRecallDecision = {
  needsRecall: boolean;
  /** The message's embedding, when it was computed: the recall search reuses it. */
  vector: number[] | null;
  decidedBy: "KEYWORDS" | "EMBEDDING" | "NONE";
  /** Why the message could not be embedded, when it could not: the keywords decided, and recall searches keyword matches only. */
  degraded?: string;
  /** The encoder's own error then, for the log (never the caller's answer). */
  error?: string;
};

/**
 * Whether a message needs earlier conversations, decided before the reply without a chat model:
 * whether the message is nearer the recall prototypes than the no-recall ones, by the margin for
 * it (RECALL_INTENT_MARGIN: lower when a keyword pattern matches). It embeds the message at most
 * once; when recall is needed that vector is the one the search uses. With an embedder that has
 * no measured margins the keyword patterns decide alone, and nothing is embedded here. When the
 * encoder fails, the keyword patterns decide too, and `degraded` says why.
 */
export async function decideRecallLocally(
  deps: { embeddings: EmbeddingsProvider },
  tenantId: string,
  message: string,
): Promise<LocalRecallDecision> {
  const byKeywords = needsRecallByKeywords(message);
  const { embeddings, model, offline } = await deps.embeddings.forTenant(tenantId);
  // Measured for the offline encoder alone, whose prototype vectors every tenant shares: a
  // tenant's own route may give its model any name, and must not fill that cache for the others.
  const margins = offline ? RECALL_INTENT_MARGIN[model] : undefined;
  if (margins === undefined) return { needsRecall: byKeywords, vector: null, decidedBy: byKeywords ? "KEYWORDS" : "NONE" };
  let embedded: { vector: number[]; recall: number; other: number };
  try {
    const vector = await embeddings.embedQuery(message);
    embedded = { vector, ...(await recallIntent(embeddings, model, vector)) };
  } catch (error) {
    if (isModelCallLimit(error)) throw error;
    // The keyword gate still works, and keyword recall with it: a reply never waits on the encoder.
    return {
      needsRecall: byKeywords,
      vector: null,
      decidedBy: byKeywords ? "KEYWORDS" : "NONE",
      degraded: "vector search unavailable: the message could not be embedded; recall was decided by keywords",
      error: (error as Error).message,
    };
  }
  const { vector, recall, other } = embedded;
  const needsRecall = recall - other >= (byKeywords ? margins.withKeywords : margins.margin);
  return { needsRecall, vector: needsRecall ? vector : null, decidedBy: !needsRecall ? "NONE" : byKeywords ? "KEYWORDS" : "EMBEDDING" };
}
