import { inSpan, type TimeHint } from "./time.ts";

/** What fusion needs to know of a snippet found by either retriever. */
export type FusionSnippet = {
  id: string;
  conversationId: string;
  occurredAt: Date;
  /** For a key (a fact's sentence): the snippet a hit on it is credited to. */
  keyOfId?: string | null;
  /** The turns just before and after it in its conversation, when known. */
  neighbourIds?: string[];
};

export type FusionOptions = {
  /** Reciprocal rank fusion's k: small lets each retriever's first ranks count. */
  rrfK: number;
  /** The keyword side's weight against the vector side's 1. */
  keywordWeight: number;
  /** How many hits each retriever brings. */
  pool: number;
  /** At most this many snippets of one conversation among the first `diversityWindow`, while others wait. */
  perConversation: number;
  /** How many of the first places the diversity rule fills (the rest follow in fused order). */
  diversityWindow: number;
  /** Added to the fused score of a snippet in the span the message names. */
  timeBoost: number;
  /**
   * Keyword hits scoring under this share of the best one's BM25 are left out: rank fusion sees
   * only ranks, so a match on nothing but a generic question word would count like a real one.
   */
  keywordFloor: number;
  /**
   * A snippet gains this share of the best fused score among its neighbouring turns (when they
   * were found too): the answer to a question is often one turn away from the turn that matches it.
   */
  neighbourWeight: number;
};

export type FusedScores = {
  vectorScore: number | null;
  vectorRank: number | null;
  keywordScore: number | null;
  keywordRank: number | null;
  fusedScore: number;
  /** In the span the message names, or in the newest/oldest conversation it asks for. */
  timeMatch: boolean;
};

/**
 * Reciprocal rank fusion of the two retrievers' hits, plus a boost for snippets in the time the
 * message names ("in May", "last Tuesday", "the last time"), then the diversity rule: among the
 * first `diversityWindow` places a conversation takes at most `perConversation` while another
 * conversation's snippet is waiting, so one session cannot fill the top of the list. Pure, so
 * the LoCoMo bench tunes it over cached retriever hits (bench/README.md).
 */
export function fuseHits(
  vector: { id: string; similarity: number }[],
  keyword: { id: string; rank: number }[],
  snippets: Map<string, FusionSnippet>,
  hint: TimeHint | null,
  k: number,
  options: FusionOptions,
): (FusedScores & { id: string })[] {
  const scores = new Map<string, FusedScores & { id: string }>();
  const entry = (id: string) => {
    let s = scores.get(id);
    if (!s) {
      s = { id, vectorScore: null, vectorRank: null, keywordScore: null, keywordRank: null, fusedScore: 0, timeMatch: false };
      scores.set(id, s);
    }
    return s;
  };
  // A key's hit counts for the snippet it points to; a snippet is credited once per retriever,
  // at the best rank any of its keys (or itself) reached. A hit whose snippet (or, for a key,
  // whose turn) was not read back, forgotten since or a vector left behind by a crash, takes no
  // place: the ones after it keep the ranks they would have had without it.
  const credited = (hits: { id: string }[]) => {
    const seen = new Set<string>();
    let rank = 0;
    return hits.slice(0, options.pool).map((hit) => {
      const target = snippets.get(hit.id)?.keyOfId ?? hit.id;
      if (!snippets.has(hit.id) || !snippets.has(target)) return null;
      rank += 1;
      if (seen.has(target)) return null;
      seen.add(target);
      return { target, rank };
    });
  };
  credited(vector).forEach((c, i) => {
    if (!c) return;
    const s = entry(c.target);
    s.vectorScore = vector[i].similarity;
    s.vectorRank = c.rank;
    s.fusedScore += 1 / (options.rrfK + c.rank);
  });
  const floor = options.keywordFloor * (keyword[0]?.rank ?? 0);
  const strong = keyword.filter((hit) => hit.rank >= floor);
  credited(strong).forEach((c, i) => {
    if (!c) return;
    const s = entry(c.target);
    s.keywordScore = strong[i].rank;
    s.keywordRank = c.rank;
    s.fusedScore += options.keywordWeight / (options.rrfK + c.rank);
  });
  const fused = [...scores.values()];
  if (options.neighbourWeight > 0) {
    const base = new Map(fused.map((s) => [s.id, s.fusedScore]));
    for (const s of fused) {
      const near = (snippets.get(s.id)?.neighbourIds ?? []).map((id) => base.get(id) ?? 0);
      if (near.length) s.fusedScore += options.neighbourWeight * Math.max(...near);
    }
  }
  if (hint && options.timeBoost > 0) boostByTime(fused, snippets, hint, options.timeBoost);
  fused.sort((a, b) => b.fusedScore - a.fusedScore || (b.vectorScore ?? 0) - (a.vectorScore ?? 0));
  return diversify(fused, snippets, k, options);
}

function boostByTime(fused: (FusedScores & { id: string })[], snippets: Map<string, FusionSnippet>, hint: TimeHint, boost: number) {
  for (const s of fused) {
    if (inSpan(hint, snippets.get(s.id)!.occurredAt)) {
      s.timeMatch = true;
      s.fusedScore += boost;
    }
  }
  if (!hint.order || fused.length === 0) return;
  // "The last time": the newest conversation among the candidates (or the oldest, for "first").
  const times = fused.map((s) => snippets.get(s.id)!.occurredAt.getTime());
  const pick = hint.order === "LATEST" ? Math.max(...times) : Math.min(...times);
  const conversation = snippets.get(fused[times.indexOf(pick)].id)!.conversationId;
  for (const s of fused) {
    if (snippets.get(s.id)!.conversationId === conversation && !s.timeMatch) {
      s.timeMatch = true;
      s.fusedScore += boost;
    }
  }
}

/** The first k of a ranked list: the first `window` places at most `cap` per conversation, then the rest in order. */
function diversify<T extends { id: string }>(
  ranked: T[],
  snippets: Map<string, FusionSnippet>,
  k: number,
  { perConversation: cap, diversityWindow: window }: Pick<FusionOptions, "perConversation" | "diversityWindow">,
): T[] {
  const head: T[] = [];
  const rest: T[] = [];
  const placed = new Map<string, number>();
  for (const s of ranked) {
    if (head.length === k) break;
    const conversation = snippets.get(s.id)!.conversationId;
    const n = placed.get(conversation) ?? 0;
    if (head.length < window && n < cap) {
      placed.set(conversation, n + 1);
      head.push(s);
    } else rest.push(s);
  }
  return [...head, ...rest].slice(0, k);
}
