import { isIP } from "node:net";
import { Worker } from "node:worker_threads";
import { EngramError } from "../errors.ts";

/**
 * Redaction (DLP) of what leaves Engram for a model. Stored data is never changed: these
 * functions take text and return the text to send, with typed placeholders in place of matches.
 */

export const DETECTORS = ["email", "phone", "card", "iban", "secret", "ip"] as const;
export type Detector = (typeof DETECTORS)[number];

export const PLACEHOLDERS: Record<Detector, string> = {
  email: "[EMAIL]",
  phone: "[PHONE]",
  card: "[CARD]",
  iban: "[IBAN]",
  secret: "[SECRET]",
  ip: "[IP]",
};

export type CustomPattern = { name: string; pattern: string; flags: string; placeholder: string };

export type RedactionRules = { detectors: Record<Detector, boolean>; custom: CustomPattern[] };

export const DEFAULT_REDACTION: RedactionRules = {
  detectors: { email: true, phone: true, card: true, iban: true, secret: true, ip: true },
  custom: [],
};

export type RedactionResult = { texts: string[]; redactions: number };

// Custom patterns run on at most this many characters at a time; longer texts go in line-aligned chunks.
export const CUSTOM_CHUNK_CHARS = 20_000;
export const CUSTOM_PATTERN_MAX_LENGTH = 500;
// A custom pattern that needs longer than this over one model call's texts is treated as hostile.
const DEFAULT_CUSTOM_TIMEOUT_MS = 1_000;

// ---------------------------------------------------------------------------------------------
// Built-in detectors: linear-time patterns, each match confirmed by a check where one exists.

function luhnValid(digits: string): boolean {
  let sum = 0;
  for (let i = 0; i < digits.length; i++) {
    let d = digits.charCodeAt(digits.length - 1 - i) - 48;
    if (i % 2 === 1) {
      d *= 2;
      if (d > 9) d -= 9;
    }
    sum += d;
  }
  return sum % 10 === 0;
}

function ibanValid(iban: string): boolean {
  if (iban.length < 15 || iban.length > 34 || !/^[A-Z]{2}\d{2}[A-Z0-9]+$/.test(iban)) return false;
  const rearranged = iban.slice(4) + iban.slice(0, 4);
  let remainder = 0;
  for (const char of rearranged) {
    const value = /\d/.test(char) ? char : String(char.charCodeAt(0) - 55);
    for (const digit of value) remainder = (remainder * 10 + Number(digit)) % 97;
  }
  return remainder === 1;
}

function shannonEntropy(text: string): number {
  const counts = new Map<string, number>();
  for (const char of text) counts.set(char, (counts.get(char) ?? 0) + 1);
  let entropy = 0;
  for (const count of counts.values()) {
    const p = count / text.length;
    entropy -= p * Math.log2(p);
  }
  return entropy;
}

const KNOWN_SECRETS = new RegExp(
  [
    String.raw`-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----`,
    String.raw`\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{10,}`, // JWT
    String.raw`\bsk-(?:proj-|ant-|live_|test_)?[A-Za-z0-9_-]{20,}`, // OpenAI, Anthropic, Stripe-like
    String.raw`\b[rp]k_(?:live|test)_[A-Za-z0-9]{16,}`, // Stripe
    String.raw`\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b`, // AWS access key ids
    String.raw`\bgh[pousr]_[A-Za-z0-9]{30,}`, // GitHub tokens
    String.raw`\bgithub_pat_[A-Za-z0-9_]{30,}`,
    String.raw`\bxox[abposr]-[A-Za-z0-9-]{10,}`, // Slack
    String.raw`\bAIza[0-9A-Za-z_-]{35}`, // Google API keys
    String.raw`\bglpat-[A-Za-z0-9_-]{20,}`, // GitLab
  ].join("|"),
  "g",
);
// Long random-looking tokens (keys of unknown formats): letters and digits mixed, high entropy.
const LONG_TOKEN = /(?<![A-Za-z0-9_+/=-])[A-Za-z0-9_+/=-]{24,}(?![A-Za-z0-9_+/=-])/g;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function looksRandom(token: string): boolean {
  if (UUID.test(token)) return false;
  if (!/\d/.test(token) || !/[A-Za-z]/.test(token)) return false;
  const classes = [/[a-z]/, /[A-Z]/, /\d/].filter((re) => re.test(token)).length;
  return classes >= 2 && shannonEntropy(token) >= (classes === 3 ? 3.5 : 3.2);
}

/** A token whose long unbroken stretch looks random: a key, not a slug such as launch-q3-2024-plan. */
function isRandomToken(token: string): boolean {
  if (UUID.test(token)) return false;
  return token.split(/[-_+/=.]/).some((part) => part.length >= 20 && looksRandom(part));
}

const EMAIL = /[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}\b/g;
const IBAN = /\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{1,4}){3,8}\b/g;
const CARD = /(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])/g;
const IPV4 = /(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\d.])/g;
const IPV6 = /(?<![0-9A-Fa-f:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{0,4}|(?:\d{1,3}\.){3}\d{1,3})(?![0-9A-Fa-f:])/g;
const PHONE = /(?<![\w+.-])(?:\+|00)?\(?\d{1,4}\)?(?:[ .-]?\(?\d{1,4}\)?){2,6}(?!\w)/g;
const DATE_LIKE = /^\d{4}[-./]\d{1,2}[-./]\d{1,2}|^\d{1,2}[-./]\d{1,2}[-./]\d{2,4}$/;

type Replace = (text: string, count: () => void) => string;

const builtIns: Record<Detector, Replace> = {
  secret: (text, count) =>
    text
      .replace(KNOWN_SECRETS, () => (count(), PLACEHOLDERS.secret))
      .replace(LONG_TOKEN, (token) => (isRandomToken(token) ? (count(), PLACEHOLDERS.secret) : token)),
  email: (text, count) => text.replace(EMAIL, () => (count(), PLACEHOLDERS.email)),
  iban: (text, count) =>
    text.replace(IBAN, (match) => {
      // The pattern may run into a following word; the longest prefix of groups that checks out wins.
      const groups = match.split(" ");
      for (let n = groups.length; n >= 1; n--) {
        if (ibanValid(groups.slice(0, n).join(""))) {
          count();
          return [PLACEHOLDERS.iban, ...groups.slice(n)].join(" ");
        }
      }
      return match;
    }),
  card: (text, count) =>
    text.replace(CARD, (match) => {
      const digits = match.replace(/\D/g, "");
      if (digits.length < 13 || digits.length > 19 || !luhnValid(digits)) return match;
      count();
      return PLACEHOLDERS.card;
    }),
  ip: (text, count) =>
    text
      .replace(IPV6, (match) => (isIP(match) === 6 && /[0-9A-Fa-f]/.test(match) ? (count(), PLACEHOLDERS.ip) : match))
      .replace(IPV4, () => (count(), PLACEHOLDERS.ip)),
  phone: (text, count) =>
    text.replace(PHONE, (match) => {
      const digits = match.replace(/\D/g, "");
      const international = /^(?:\+|00)/.test(match);
      if (digits.length > 15 || digits.length < (international ? 7 : 9)) return match;
      if (DATE_LIKE.test(match.trim())) return match;
      count();
      return PLACEHOLDERS.phone;
    }),
};

// Specific formats first, so a card or an IBAN is not half-taken by the phone detector.
const ORDER: Detector[] = ["secret", "email", "iban", "card", "ip", "phone"];

/** Applies the switched-on built-in detectors to one text. */
export function redactBuiltIn(text: string, detectors: Record<Detector, boolean>): { text: string; redactions: number } {
  let redactions = 0;
  const count = () => void redactions++;
  for (const detector of ORDER) if (detectors[detector]) text = builtIns[detector](text, count);
  return { text, redactions };
}

// ---------------------------------------------------------------------------------------------
// Custom patterns: validated when saved, and run off the main thread under a time limit.

/**
 * A quantified group that itself contains a quantifier ((a+)+, (\w*)*, (x{2,})+) is the classic
 * shape of catastrophic backtracking; so are backreferences. Both are refused when saved.
 */
export function unsafePatternReason(pattern: string): string | null {
  if (/\\[1-9]|\\k</.test(pattern)) return "backreferences are not allowed";
  type Frame = { quantified: boolean };
  const stack: Frame[] = [{ quantified: false }];
  let inClass = false;
  let lastClosed: Frame | null = null;
  for (let i = 0; i < pattern.length; i++) {
    const char = pattern[i];
    if (char === "\\") {
      i++;
      lastClosed = null;
      continue;
    }
    if (inClass) {
      if (char === "]") inClass = false;
      continue;
    }
    const isQuantifier =
      char === "+" || char === "*" || (char === "{" && /^\{\d*,?\d*\}/.test(pattern.slice(i)) && !/^\{\d+\}/.test(pattern.slice(i)));
    if (isQuantifier) {
      if (lastClosed?.quantified) return "nested quantifiers (such as (a+)+) can take exponential time";
      stack[stack.length - 1].quantified = true;
      lastClosed = null;
      continue;
    }
    lastClosed = null;
    if (char === "[") inClass = true;
    else if (char === "(") stack.push({ quantified: false });
    else if (char === ")" && stack.length > 1) {
      const closed = stack.pop()!;
      if (closed.quantified) stack[stack.length - 1].quantified = true;
      lastClosed = closed;
    }
  }
  return null;
}

/** Why a custom pattern is refused, or null when it may be saved. */
export function customPatternProblem(pattern: string, flags: string): string | null {
  if (pattern.length === 0) return "the pattern is empty";
  if (pattern.length > CUSTOM_PATTERN_MAX_LENGTH) return `the pattern is longer than ${CUSTOM_PATTERN_MAX_LENGTH} characters`;
  if (!/^[imsu]*$/.test(flags)) return "flags may only be i, m, s and u";
  try {
    new RegExp(pattern, flags);
  } catch (error) {
    return `not a valid regular expression: ${(error as Error).message}`;
  }
  if (new RegExp(pattern, flags).test("")) return "the pattern matches the empty string";
  return unsafePatternReason(pattern);
}

function chunks(text: string): string[] {
  if (text.length <= CUSTOM_CHUNK_CHARS) return [text];
  const parts: string[] = [];
  let rest = text;
  while (rest.length > CUSTOM_CHUNK_CHARS) {
    const cut = rest.lastIndexOf("\n", CUSTOM_CHUNK_CHARS);
    const at = cut > CUSTOM_CHUNK_CHARS / 2 ? cut + 1 : CUSTOM_CHUNK_CHARS;
    parts.push(rest.slice(0, at));
    rest = rest.slice(at);
  }
  parts.push(rest);
  return parts;
}

// The worker applies patterns to texts and answers with the results; it holds no state.
const WORKER_SOURCE = `
const { parentPort } = require("node:worker_threads");
parentPort.on("message", ({ id, patterns, texts }) => {
  try {
    let redactions = 0;
    const out = texts.map((parts) => parts.map((part) => {
      for (const p of patterns) {
        part = part.replace(new RegExp(p.pattern, "g" + p.flags), () => (redactions++, p.placeholder));
      }
      return part;
    }).join(""));
    parentPort.postMessage({ id, texts: out, redactions });
  } catch (error) {
    parentPort.postMessage({ id, error: String(error && error.message || error) });
  }
});
`;

type Job = { patterns: CustomPattern[]; texts: string[][]; resolve(r: RedactionResult): void; reject(e: Error): void };

/**
 * One worker thread running custom patterns, one request at a time. A request that runs past
 * the time limit terminates the worker (a runaway regex cannot be interrupted otherwise); the
 * next request starts a fresh one.
 */
class CustomPatternRunner {
  private worker?: Worker;
  private queue: Job[] = [];
  private busy = false;
  private nextId = 0;

  constructor(private readonly timeoutMs: number) {}

  run(patterns: CustomPattern[], texts: string[]): Promise<RedactionResult> {
    return new Promise((resolve, reject) => {
      this.queue.push({ patterns, texts: texts.map(chunks), resolve, reject });
      this.pump();
    });
  }

  async close() {
    const worker = this.worker;
    this.worker = undefined;
    await worker?.terminate();
  }

  private pump() {
    if (this.busy) return;
    const job = this.queue.shift();
    if (!job) {
      this.worker?.unref();
      return;
    }
    this.busy = true;
    const worker = (this.worker ??= new Worker(WORKER_SOURCE, { eval: true }));
    worker.ref();
    const id = this.nextId++;
    const finish = (settle: () => void) => {
      clearTimeout(timer);
      worker.off("message", onMessage);
      worker.off("error", onError);
      this.busy = false;
      settle();
      this.pump();
    };
    const onMessage = (message: { id: number; texts?: string[]; redactions?: number; error?: string }) => {
      if (message.id !== id) return;
      finish(() =>
        message.error
          ? job.reject(new EngramError("REDACTION_FAILED", `A custom redaction pattern failed: ${message.error}`))
          : job.resolve({ texts: message.texts!, redactions: message.redactions! }),
      );
    };
    const onError = (error: Error) => {
      if (this.worker === worker) this.worker = undefined;
      finish(() => job.reject(new EngramError("REDACTION_FAILED", `Redaction worker failed: ${error.message}`)));
    };
    const timer = setTimeout(() => {
      if (this.worker === worker) this.worker = undefined;
      void worker.terminate();
      finish(() =>
        job.reject(
          new EngramError(
            "REDACTION_FAILED",
            `A custom redaction pattern took longer than ${this.timeoutMs} ms; nothing was sent to the model. Fix or remove the pattern.`,
          ),
        ),
      );
    }, this.timeoutMs);
    worker.on("message", onMessage);
    worker.on("error", onError);
    worker.postMessage({ id, patterns: job.patterns, texts: job.texts });
  }
}

let sharedRunner: CustomPatternRunner | undefined;

/**
 * The tenant's rules applied to texts bound for a model: built-in detectors in this thread, then
 * custom patterns in a worker thread under a time limit. A pattern that runs too long rejects
 * with REDACTION_FAILED and nothing is sent: failing closed keeps the call (and its job) waiting
 * instead of leaking what the pattern was meant to catch.
 */
export async function redactTexts(
  rules: RedactionRules,
  texts: string[],
  options: { timeoutMs?: number } = {},
): Promise<RedactionResult> {
  let redactions = 0;
  let out = texts.map((text) => {
    const result = redactBuiltIn(text, rules.detectors);
    redactions += result.redactions;
    return result.text;
  });
  if (rules.custom.length > 0) {
    const runner =
      options.timeoutMs !== undefined
        ? new CustomPatternRunner(options.timeoutMs)
        : (sharedRunner ??= new CustomPatternRunner(DEFAULT_CUSTOM_TIMEOUT_MS));
    try {
      const custom = await runner.run(rules.custom, out);
      out = custom.texts;
      redactions += custom.redactions;
    } finally {
      if (runner !== sharedRunner) await runner.close();
    }
  }
  return { texts: out, redactions };
}
