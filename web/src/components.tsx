import { diffWords } from "diff";
import { compiler } from "markdown-to-jsx/react";
import { useLayoutEffect, useRef, useState, type MouseEvent, type ReactNode } from "react";
import type { ApiError } from "./api.ts";
import { href, navigate } from "./hooks.ts";

export function Link({ to, children, className }: { to: string; children: ReactNode; className?: string }) {
  const onClick = (event: MouseEvent<HTMLAnchorElement>) => {
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0) return;
    event.preventDefault();
    navigate(to);
  };
  return (
    <a href={href(to)} onClick={onClick} className={className}>
      {children}
    </a>
  );
}

// Markdown is compiled to React elements (never to an HTML string), raw HTML in the text is not
// parsed, and the library's URL sanitizer drops javascript: and similar links.
const MARKDOWN = {
  disableParsingRawHTML: true,
  forceBlock: true,
  overrides: {
    a: { props: { rel: "noopener noreferrer nofollow", target: "_blank" } },
    // Nothing is loaded from elsewhere: an image shows as its alt text.
    img: { component: ({ alt }: { alt?: string }) => <span className="muted">[image: {alt || "no description"}]</span> },
    h1: { component: "strong" },
    h2: { component: "strong" },
    h3: { component: "strong" },
  },
};

/** Text that agents and people write in Markdown (entries, events), rendered safely. */
export function Prose({ text, className }: { text: string; className?: string }) {
  return <div className={`prose ${className ?? ""}`}>{compiler(text, MARKDOWN as never)}</div>;
}

export function Empty({ children }: { children: ReactNode }) {
  return <p className="empty">{children}</p>;
}

export function Failure({ error, retry }: { error: ApiError; retry?: () => void }) {
  const hint =
    error.kind === "unreachable"
      ? "Check that Engram is running; the page retries when you ask it to."
      : error.kind === "unauthenticated"
        ? "The key was refused: sign out and sign in with a valid key."
        : error.kind === "forbidden"
          ? "This key's role may not do that."
          : undefined;
  return (
    <div className="failure" role="alert">
      <strong>{error.message}</strong>
      {hint && <span> {hint}</span>}
      {retry && (
        <button type="button" onClick={retry}>
          Try again
        </button>
      )}
    </div>
  );
}

export function Loading() {
  return (
    <p className="loading" aria-live="polite">
      Loading…
    </p>
  );
}

export const time = (iso: string) => new Date(iso).toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });

export const clip = (text: string, max = 240) => (text.length > max ? `${text.slice(0, max)}…` : text);

/** Word diff of two texts: removed words struck through, added ones marked. */
export function Diff({ before, after }: { before: string; after: string }) {
  return (
    <p className="diff">
      {diffWords(before, after).map((part, index) =>
        part.added ? (
          <ins key={index}>{part.value}</ins>
        ) : part.removed ? (
          <del key={index}>{part.value}</del>
        ) : (
          <span key={index}>{part.value}</span>
        ),
      )}
    </p>
  );
}

export type Series = { name: string; className: string; values: number[] };

/**
 * The chart's drawn width in CSS pixels: the SVG is drawn at that width, so its 11 px labels stay
 * 11 px on a phone and on a wide screen instead of scaling with the box.
 */
function useWidth(fallback = 640) {
  const ref = useRef<HTMLElement>(null);
  const [width, setWidth] = useState(fallback);
  useLayoutEffect(() => {
    const element = ref.current;
    if (!element) return;
    const measure = () => setWidth(Math.max(240, Math.round(element.clientWidth - 16)));
    measure();
    const observer = new ResizeObserver(measure);
    observer.observe(element);
    return () => observer.disconnect();
  }, []);
  return [ref, width] as const;
}

/** Every how many labels one is drawn, so labels about `chars` wide never touch. */
const labelStep = (count: number, room: number, chars: number) => Math.max(1, Math.ceil(count / Math.max(1, Math.floor(room / (chars * 7 + 12)))));
const longest = (labels: string[]) => Math.max(1, ...labels.map((l) => l.length));

/** A line chart in plain SVG: x is the point's index, labelled by `labels`. */
export function LineChart({ title, labels, series, unit }: { title: string; labels: string[]; series: Series[]; unit: string }) {
  const [box, width] = useWidth();
  const height = 220;
  const pad = { left: 48, right: 12, top: 12, bottom: 28 };
  const max = Math.max(1, ...series.flatMap((s) => s.values));
  const n = labels.length;
  const x = (i: number) => pad.left + (n <= 1 ? 0 : (i * (width - pad.left - pad.right)) / (n - 1));
  const y = (v: number) => height - pad.bottom - (v / max) * (height - pad.top - pad.bottom);
  const ticks = [0, max / 2, max].map((v) => Math.round(v));
  const every = labelStep(n, width - pad.left - pad.right, longest(labels));
  return (
    <figure className="chart" ref={box as never}>
      <svg viewBox={`0 0 ${width} ${height}`} width={width} height={height} role="img" aria-label={title}>
        <title>{title}</title>
        {ticks.map((tick) => (
          <g key={tick}>
            <line className="grid" x1={pad.left} x2={width - pad.right} y1={y(tick)} y2={y(tick)} />
            <text className="axis" x={pad.left - 6} y={y(tick) + 4} textAnchor="end">
              {tick}
            </text>
          </g>
        ))}
        {labels.map((label, i) =>
          i % every === 0 && (i === n - 1 || n - 1 - i >= every || i === 0) ? (
            <text key={i} className="axis" x={x(i)} y={height - 8} textAnchor="middle">
              {label}
            </text>
          ) : null,
        )}
        {series.map((s) => (
          <g key={s.name} className={s.className}>
            <polyline fill="none" points={s.values.map((v, i) => `${x(i)},${y(v)}`).join(" ")} />
            {s.values.map((v, i) => (
              <circle key={i} cx={x(i)} cy={y(v)} r={2.5}>
                <title>{`${s.name} at ${labels[i]}: ${v} ${unit}`}</title>
              </circle>
            ))}
          </g>
        ))}
      </svg>
      <figcaption>
        {series.map((s) => (
          <span key={s.name} className={`legend ${s.className}`}>
            {s.name}
          </span>
        ))}
      </figcaption>
    </figure>
  );
}

/** Stacked bars in plain SVG: one bar per label, one colour per key. */
export function StackedBars({ title, labels, keys, values }: { title: string; labels: string[]; keys: string[]; values: number[][] }) {
  const [box, width] = useWidth();
  const height = 220;
  const pad = { left: 56, right: 12, top: 12, bottom: 28 };
  const totals = values.map((row) => row.reduce((a, b) => a + b, 0));
  const max = Math.max(1, ...totals);
  const band = (width - pad.left - pad.right) / Math.max(1, labels.length);
  const scale = (v: number) => (v / max) * (height - pad.top - pad.bottom);
  const every = labelStep(labels.length, width - pad.left - pad.right, longest(labels));
  return (
    <figure className="chart" ref={box as never}>
      <svg viewBox={`0 0 ${width} ${height}`} width={width} height={height} role="img" aria-label={title}>
        <title>{title}</title>
        {[0, max / 2, max].map((tick) => (
          <g key={tick}>
            <line className="grid" x1={pad.left} x2={width - pad.right} y1={height - pad.bottom - scale(tick)} y2={height - pad.bottom - scale(tick)} />
            <text className="axis" x={pad.left - 6} y={height - pad.bottom - scale(tick) + 4} textAnchor="end">
              {Math.round(tick)}
            </text>
          </g>
        ))}
        {labels.map((label, i) => {
          let base = height - pad.bottom;
          return (
            <g key={label}>
              {values[i].map((v, k) => {
                const h = scale(v);
                base -= h;
                return (
                  <rect key={k} className={`bar bar-${k % 6}`} x={pad.left + i * band + band * 0.15} width={band * 0.7} y={base} height={h}>
                    <title>{`${label} · ${keys[k]}: ${v}`}</title>
                  </rect>
                );
              })}
              {i % every === 0 && (
                <text className="axis" x={pad.left + i * band + band / 2} y={height - 8} textAnchor="middle">
                  {label}
                </text>
              )}
            </g>
          );
        })}
      </svg>
      <figcaption>
        {keys.map((k, i) => (
          <span key={k} className={`legend bar-${i % 6}`}>
            {k}
          </span>
        ))}
      </figcaption>
    </figure>
  );
}
