import * as chrono from "chrono-node";

/** The time a message points at, resolved against when it was said. */
export type TimeHint = {
  /** The span it names (inclusive bounds, either open for "before …" / "after …"). */
  from: Date | null;
  to: Date | null;
  /** "last time" / "the first time": the newest or the oldest of the candidates. */
  order: "LATEST" | "EARLIEST" | null;
  /** The words that named it. */
  text: string;
};

const DAY = 86_400_000;
// People speak of an event a few days after it ("on Friday I…" in Monday's chat): a named day
// matches the snippets of the days around it.
const DAY_SLACK = 3 * DAY;

// chrono reads dates, weekdays, months and relative phrases but not a bare year ("in 2022").
const parser = chrono.casual.clone();
parser.parsers.push({
  pattern: () => /\b(?:in|of|since|before|after|during|until|from)\s+((?:19|20)\d{2})\b/i,
  extract: (context, match) =>
    context.createParsingComponents({ year: Number(match[1]) }).imply("month", 1).imply("day", 1),
});

const startOfUtcDay = (d: Date) => Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate());

/** The span one parsed component covers, at the precision its speaker gave. */
function span(component: chrono.ParsedComponents): { from: number; to: number } {
  const d = component.date();
  const year = d.getUTCFullYear();
  const month = d.getUTCMonth();
  if (component.isCertain("day") || component.isCertain("weekday")) {
    const day = startOfUtcDay(d);
    return { from: day - DAY_SLACK, to: day + DAY + DAY_SLACK - 1 };
  }
  if (component.isCertain("month")) return { from: Date.UTC(year, month, 1), to: Date.UTC(year, month + 1, 1) + DAY_SLACK - 1 };
  return { from: Date.UTC(year, 0, 1), to: Date.UTC(year + 1, 0, 1) - 1 };
}

/**
 * The time expressions of a message ("last Tuesday", "two months ago", "in May", "before
 * August", "the last time"), resolved against `at`, the time it was said (UTC). Null when it
 * names no time. The first expression wins; "before"/"after"/"since" just ahead of it open the
 * span on that side.
 */
export function resolveTimeHint(text: string, at: Date): TimeHint | null {
  const order = /\b(?:last|previous|latest|most recent)\s+time\b/i.test(text)
    ? "LATEST"
    : /\b(?:first\s+time|at\s+first|originally|earliest)\b/i.test(text)
      ? "EARLIEST"
      : null;
  const [result] = parser.parse(text, { instant: at, timezone: 0 }, { forwardDate: false });
  if (!result) return order ? { from: null, to: null, order, text: text.match(/\b(?:last|previous|latest|most recent|first)\b[^.?!]*?\btime\b|\bat first\b|\boriginally\b|\bearliest\b/i)?.[0] ?? "" } : null;
  const start = span(result.start);
  const end = result.end ? span(result.end) : start;
  const before = text.slice(0, result.index).match(/\b(before|until|till|prior to|by|after|since)\s+(?:the\s+)?$/i)?.[1]?.toLowerCase();
  const opensAfter = before === "after" || before === "since";
  const opensBefore = before !== undefined && !opensAfter;
  return {
    from: opensBefore ? null : new Date(opensAfter ? end.to : start.from),
    to: opensAfter ? null : new Date(opensBefore ? start.from : end.to),
    order,
    text: result.text,
  };
}

/** Whether an instant falls in the hint's span (a hint with only an order has none). */
export function inSpan(hint: TimeHint, at: Date): boolean {
  if (!hint.from && !hint.to) return false;
  const t = at.getTime();
  return (!hint.from || t >= hint.from.getTime()) && (!hint.to || t <= hint.to.getTime());
}
