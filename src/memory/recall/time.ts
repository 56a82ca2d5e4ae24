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

// chrono reads dates, weekdays, months and relative phrases but not a bare year ("in 2022"). The
// match holds its preposition (chrono drops a match of digits alone as unlikely a date).
const parser = chrono.casual.clone();
parser.parsers.push({
  pattern: () => /\b(?:in|of|since|before|after|during|until|from)\s+((?:19|20)\d{2})\b/i,
  extract: (context, match) =>
    context.createParsingComponents({ year: Number(match[1]) }).imply("month", 1).imply("day", 1),
});

// A word that opens a span on one side, just ahead of a time expression or at its start ("since 2022").
const OPENER = "before|until|till|prior to|by|after|since";
const openerAhead = new RegExp(`\\b(${OPENER})\\s+(?:the\\s+)?$`, "i");
const openerAtStart = new RegExp(`^(${OPENER})\\s+`, "i");

/**
 * What one parsed component names, at the precision its speaker gave: the period itself
 * (`start` inclusive, `end` exclusive) and the span it matches (`from`, `to`, inclusive), which
 * reaches a few days past a day or a month. Null for a time of day alone ("morning", "at 7pm"):
 * it names no day.
 */
function span(component: chrono.ParsedComponents, yearsBack = 0): { start: number; end: number; from: number; to: number } | null {
  const d = component.date();
  const year = d.getUTCFullYear() - yearsBack;
  const month = d.getUTCMonth();
  if (component.isCertain("day") || component.isCertain("weekday")) {
    const day = Date.UTC(year, month, d.getUTCDate());
    return { start: day, end: day + DAY, from: day - DAY_SLACK, to: day + DAY + DAY_SLACK - 1 };
  }
  if (component.isCertain("month")) {
    const start = Date.UTC(year, month, 1);
    const end = Date.UTC(year, month + 1, 1);
    return { start, end, from: start, to: end + DAY_SLACK - 1 };
  }
  if (component.isCertain("year")) {
    const start = Date.UTC(year, 0, 1);
    const end = Date.UTC(year + 1, 0, 1);
    return { start, end, from: start, to: end - 1 };
  }
  return null;
}

/**
 * A component's span, in the past: a weekday named alone ("before Friday" on a Wednesday) is the
 * last one before `at`, and a day or month named without its year ("in June" asked in January)
 * last year's, not the coming one.
 */
function pastSpan(component: chrono.ParsedComponents, at: Date) {
  const found = span(component);
  if (!found || component.isCertain("year") || found.start <= at.getTime()) return found;
  if (component.isCertain("weekday") && !component.isCertain("day")) {
    const week = 7 * DAY;
    return { start: found.start - week, end: found.end - week, from: found.from - week, to: found.to - week };
  }
  return span(component, 1);
}

/**
 * The time expressions of a message ("last Tuesday", "two months ago", "in May", "before
 * August", "the last time"), resolved against `at`, the time it was said (UTC). Null when it
 * names no time. The first expression that names a day, a month or a year wins ("good morning"
 * names none); "since"/"after" just ahead of it open the span after it, "before"/"until"/"by"
 * before it (since and until take the period in, after and before leave it out, each with the
 * few days' slack around the boundary).
 */
export function resolveTimeHint(text: string, at: Date): TimeHint | null {
  const order = /\b(?:last|previous|latest|most recent)\s+time\b/i.test(text)
    ? "LATEST"
    : /\b(?:first\s+time|at\s+first|originally|earliest)\b/i.test(text)
      ? "EARLIEST"
      : null;
  for (const result of parser.parse(text, { instant: at, timezone: 0 }, { forwardDate: false })) {
    const start = pastSpan(result.start, at);
    if (!start) continue;
    const end = (result.end && pastSpan(result.end, at)) ?? start;
    const before = (result.text.match(openerAtStart) ?? text.slice(0, result.index).match(openerAhead))?.[1]?.toLowerCase();
    const bound = (ms: number) => new Date(ms);
    switch (before) {
      case "since":
        return { from: bound(start.from), to: null, order, text: result.text };
      case "after":
        return { from: bound(end.end - DAY_SLACK), to: null, order, text: result.text };
      case "until":
      case "till":
      case "by":
        return { from: null, to: bound(end.to), order, text: result.text };
      case "before":
      case "prior to":
        return { from: null, to: bound(start.start + DAY_SLACK - 1), order, text: result.text };
      default:
        return { from: bound(start.from), to: bound(end.to), order, text: result.text };
    }
  }
  return order ? { from: null, to: null, order, text: text.match(/\b(?:last|previous|latest|most recent|first)\b[^.?!]*?\btime\b|\bat first\b|\boriginally\b|\bearliest\b/i)?.[0] ?? "" } : null;
}

/** Whether an instant falls in the hint's span (a hint with only an order has none). */
export function inSpan(hint: TimeHint, at: Date): boolean {
  if (!hint.from && !hint.to) return false;
  const t = at.getTime();
  return (!hint.from || t >= hint.from.getTime()) && (!hint.to || t <= hint.to.getTime());
}
