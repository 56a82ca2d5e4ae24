import { describe, expect, it } from "vitest";
import { fuseHits, type FusionOptions, type FusionSnippet } from "../src/memory/recall/fusion.ts";
import { withNeighbours } from "../src/memory/recall/recall.ts";
import { resolveTimeHint } from "../src/memory/recall/time.ts";

// A Wednesday.
const asked = new Date("2023-10-25T15:00:00Z");
const day = (iso: string) => new Date(`${iso}T12:00:00Z`);
const within = (hint: ReturnType<typeof resolveTimeHint>, iso: string) => {
  const t = day(iso).getTime();
  return (!hint?.from || t >= hint.from.getTime()) && (!hint?.to || t <= hint.to.getTime());
};

describe("time expressions in a recall message", () => {
  it("resolves weekdays, relative dates, months and years against when the message was said", () => {
    const tuesday = resolveTimeHint("what did we say last Tuesday about the order?", asked);
    expect(tuesday?.text).toBe("last Tuesday");
    expect(within(tuesday, "2023-10-24")).toBe(true);
    expect(within(tuesday, "2023-10-10")).toBe(false);

    const ago = resolveTimeHint("the hotel I told you about two months ago", asked);
    expect(within(ago, "2023-08-14")).toBe(true);
    expect(within(ago, "2023-10-14")).toBe(false);

    const may = resolveTimeHint("When did Melanie go camping in May?", asked);
    expect(within(may, "2023-05-20")).toBe(true);
    expect(within(may, "2023-04-28")).toBe(false);
    expect(within(may, "2022-05-20")).toBe(false);

    const year = resolveTimeHint("what did I buy in 2022?", asked);
    expect(within(year, "2022-03-01")).toBe(true);
    expect(within(year, "2023-03-01")).toBe(false);
  });

  it("opens the span for before / after, and reads 'the last time' and 'the first time' as an order", () => {
    const before = resolveTimeHint("what did I order before August?", asked);
    expect(before?.from).toBeNull();
    expect(within(before, "2023-07-20")).toBe(true);
    expect(within(before, "2023-08-20")).toBe(false);

    const after = resolveTimeHint("anything new since 3 September 2023?", asked);
    expect(after?.to).toBeNull();
    expect(within(after, "2023-10-01")).toBe(true);
    expect(within(after, "2023-08-01")).toBe(false);

    expect(resolveTimeHint("what did I get the last time?", asked)).toMatchObject({ order: "LATEST", from: null, to: null });
    expect(resolveTimeHint("what did I order the first time?", asked)?.order).toBe("EARLIEST");
  });

  it("finds no time where there is none (\"May I…\" is not a month, \"good morning\" names no day)", () => {
    expect(resolveTimeHint("May I have my usual coffee?", asked)).toBeNull();
    expect(resolveTimeHint("Which running shoes did I buy?", asked)).toBeNull();
    expect(resolveTimeHint("Good morning! Can you book a table by 7pm?", asked)).toBeNull();
    expect(resolveTimeHint("Good evening, same as last time please", asked)).toMatchObject({ order: "LATEST", from: null, to: null });
  });

  it("opens a year's span for since / before / after, takes the named day in for since and until, and reads a month without its year in the past", () => {
    const since = resolveTimeHint("what changed since 2022?", asked);
    expect(since?.to).toBeNull();
    expect(within(since, "2022-02-01")).toBe(true);
    expect(within(since, "2021-06-01")).toBe(false);
    const before = resolveTimeHint("what did I buy before 2022?", asked);
    expect(before?.from).toBeNull();
    expect(within(before, "2021-06-01")).toBe(true);
    expect(within(before, "2022-06-01")).toBe(false);
    const after = resolveTimeHint("anything after 2021?", asked);
    expect(within(after, "2022-03-01")).toBe(true);
    expect(within(after, "2021-03-01")).toBe(false);

    // "since 3 September": the 3rd itself and the days after it.
    const sinceDay = resolveTimeHint("anything new since 3 September 2023?", asked);
    expect(within(sinceDay, "2023-09-03")).toBe(true);
    expect(within(sinceDay, "2023-09-04")).toBe(true);
    // "before Friday" (the 20th, asked on Wednesday the 25th): the days just before it are in.
    const beforeFriday = resolveTimeHint("what did I say before Friday?", asked);
    expect(within(beforeFriday, "2023-10-19")).toBe(true);
    expect(within(beforeFriday, "2023-10-25")).toBe(false);

    // Asked in January, "in June" is last June, not the coming one.
    const june = resolveTimeHint("what did I buy in June?", new Date("2024-01-20T15:00:00Z"));
    expect(within(june, "2023-06-15")).toBe(true);
    expect(within(june, "2024-06-15")).toBe(false);
  });
});

describe("fusion", () => {
  const options: FusionOptions = { rrfK: 5, keywordWeight: 1, pool: 10, perConversation: 10, diversityWindow: 10, timeBoost: 0.1, keywordFloor: 0, neighbourWeight: 0 };
  const snippets = new Map<string, FusionSnippet>([
    ["a1", { id: "a1", conversationId: "A", occurredAt: day("2023-05-02") }],
    ["a2", { id: "a2", conversationId: "A", occurredAt: day("2023-05-02") }],
    ["a3", { id: "a3", conversationId: "A", occurredAt: day("2023-05-02") }],
    ["b1", { id: "b1", conversationId: "B", occurredAt: day("2023-07-10") }],
    ["c1", { id: "c1", conversationId: "C", occurredAt: day("2023-09-01") }],
  ]);
  const vector = ["a1", "a2", "a3", "b1", "c1"].map((id, i) => ({ id, similarity: 0.9 - i / 10 }));
  const keyword = ["a2", "b1"].map((id, i) => ({ id, rank: 5 - i }));

  it("credits each snippet once with both ranks, and lets one conversation place at most N ahead of the others", () => {
    const all = fuseHits(vector, keyword, snippets, null, 5, options);
    expect(all.map((f) => f.id)).toEqual(["a2", "b1", "a1", "a3", "c1"]);
    expect(all[0]).toMatchObject({ vectorRank: 2, keywordRank: 1 });
    const diverse = fuseHits(vector, keyword, snippets, null, 5, { ...options, perConversation: 1 });
    expect(diverse.map((f) => f.id)).toEqual(["a2", "b1", "c1", "a1", "a3"]);
    // The rule fills only the first places: after them, the fused order.
    const head = fuseHits(vector, keyword, snippets, null, 5, { ...options, perConversation: 1, diversityWindow: 2 });
    expect(head.map((f) => f.id)).toEqual(["a2", "b1", "a1", "a3", "c1"]);
    // The product's rule, 3 in the first 5: a fourth snippet of A waits for B.
    const four = new Map([...snippets, ["a4", { id: "a4", conversationId: "A", occurredAt: day("2023-05-02") }]]);
    const ranked = ["a1", "a2", "a3", "a4", "b1"].map((id, i) => ({ id, similarity: 0.9 - i / 10 }));
    const product = fuseHits(ranked, [], four, null, 5, { ...options, perConversation: 3, diversityWindow: 5 });
    expect(product.map((f) => f.id)).toEqual(["a1", "a2", "a3", "b1", "a4"]);
  });

  it("ranks snippets in the span the message names higher, and the newest conversation for 'the last time'", () => {
    const july = fuseHits(vector, keyword, snippets, resolveTimeHint("what did I say in July?", asked), 5, options);
    expect(july[0]).toMatchObject({ id: "b1", timeMatch: true });
    expect(july.filter((f) => f.timeMatch).map((f) => f.id)).toEqual(["b1"]);
    const latest = fuseHits(vector, keyword, snippets, resolveTimeHint("what did we talk about the last time?", asked), 5, { ...options, timeBoost: 0.3 });
    expect(latest[0]).toMatchObject({ id: "c1", timeMatch: true });
    const untimed = fuseHits(vector, keyword, snippets, resolveTimeHint("what did I say in July?", asked), 5, { ...options, timeBoost: 0 });
    expect(untimed[0].id).toBe("a2");
  });

  it("leaves out keyword hits far under the best one, and lifts a turn whose neighbouring turn was found", () => {
    // b1's BM25 score is a fifth of a2's: under a floor of 0.5 it keeps only its vector rank.
    const weak = [{ id: "a2", rank: 5 }, { id: "b1", rank: 1 }];
    expect(fuseHits(vector, weak, snippets, null, 5, options).find((f) => f.id === "b1")?.keywordRank).toBe(2);
    const floored = fuseHits(vector, weak, snippets, null, 5, { ...options, keywordFloor: 0.5 });
    expect(floored.find((f) => f.id === "b1")).toMatchObject({ keywordRank: null, vectorRank: 4 });

    // c1 follows b1 in its conversation: with a neighbour weight it gains a share of b1's score.
    const near = new Map(snippets);
    near.set("c1", { ...snippets.get("c1")!, conversationId: "B", neighbourIds: ["b1"] });
    near.set("b1", { ...snippets.get("b1")!, neighbourIds: ["c1"] });
    const alone = fuseHits(vector, keyword, near, null, 5, options);
    const lifted = fuseHits(vector, keyword, near, null, 5, { ...options, neighbourWeight: 0.5 });
    const b1 = alone.find((f) => f.id === "b1")!.fusedScore;
    const c1 = (list: typeof alone) => list.find((f) => f.id === "c1")!.fusedScore;
    expect(c1(lifted)).toBeCloseTo(c1(alone) + 0.5 * b1);
    expect(lifted.map((f) => f.id).indexOf("c1")).toBeLessThan(alone.map((f) => f.id).indexOf("c1"));
  });

  it("knows a found turn's found neighbours: the turns whose messages come right before and after it", () => {
    const turn = (id: string, conversationId: string, messageSeqs: number[]) => ({ id, kind: "TURN", conversationId, messageSeqs });
    const snippets = new Map(
      [turn("t1", "A", [1, 2]), turn("t2", "A", [3, 4]), turn("t4", "A", [7]), turn("u1", "B", [5]), { ...turn("s", "A", []), kind: "SUMMARY" }].map(
        (s) => [s.id, s],
      ),
    );
    const near = withNeighbours(snippets);
    expect(Object.fromEntries([...near.values()].map((s) => [s.id, s.neighbourIds]))).toEqual({ t1: ["t2"], t2: ["t1"], t4: [], u1: [], s: [] });
    // A 0 stands for a message deleted since: t3's span is its other message alone, so it follows t2.
    const gapped = withNeighbours(new Map([...snippets, ["t3", turn("t3", "A", [0, 5])]]));
    expect(gapped.get("t3")?.neighbourIds).toEqual(["t2"]);
    expect(gapped.get("t2")?.neighbourIds).toEqual(["t1", "t3"]);
  });

  it("gives a hit whose snippet was not read back (forgotten since) no place: the hits after it keep their ranks", () => {
    const withGone = [vector[0], { id: "gone", similarity: 0.85 }, ...vector.slice(1)];
    const ranks = (list: ReturnType<typeof fuseHits>) => Object.fromEntries(list.map((f) => [f.id, [f.vectorRank, f.keywordRank]]));
    const plain = fuseHits(vector, keyword, snippets, null, 5, options);
    const gone = fuseHits(withGone, [{ id: "gone", rank: 9 }, ...keyword], snippets, null, 5, options);
    expect(gone.map((f) => f.id)).toEqual(plain.map((f) => f.id));
    expect(ranks(gone)).toEqual(ranks(plain));
  });
});
