import { createRequire } from "node:module";
import { isIP } from "node:net";
import { Worker } from "node:worker_threads";
import { RE2JS } from "re2js";
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

export const CUSTOM_PATTERN_MAX_LENGTH = 500;
// Custom patterns over one model call's texts get this long, plus this much per 1,000 characters
// per pattern (re2js measured ~15 ms per 1,000 characters on the hardest patterns here).
const DEFAULT_CUSTOM_TIMEOUT_MS = 1_000;
const DEFAULT_MS_PER_THOUSAND_CHARS = 50;

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

/** Replaces one detector's finds in a text, telling `found` each value it replaces. */
type Replace = (text: string, found: (value: string) => void) => string;

const builtIns: Record<Detector, Replace> = {
  secret: (text, found) =>
    text
      .replace(KNOWN_SECRETS, (match) => (found(match), PLACEHOLDERS.secret))
      .replace(LONG_TOKEN, (token) => (isRandomToken(token) ? (found(token), PLACEHOLDERS.secret) : token)),
  email: (text, found) => text.replace(EMAIL, (match) => (found(match), PLACEHOLDERS.email)),
  iban: (text, found) =>
    text.replace(IBAN, (match) => {
      // The pattern may run into a following word; the longest prefix of groups that checks out wins.
      const groups = match.split(" ");
      for (let n = groups.length; n >= 1; n--) {
        const iban = groups.slice(0, n).join("");
        if (ibanValid(iban)) {
          found(groups.slice(0, n).join(" "));
          return [PLACEHOLDERS.iban, ...groups.slice(n)].join(" ");
        }
      }
      return match;
    }),
  card: (text, found) =>
    text.replace(CARD, (match) => {
      const digits = match.replace(/\D/g, "");
      if (digits.length < 13 || digits.length > 19 || !luhnValid(digits)) return match;
      found(match);
      return PLACEHOLDERS.card;
    }),
  ip: (text, found) =>
    text
      .replace(IPV6, (match) => (isIP(match) === 6 && /[0-9A-Fa-f]/.test(match) ? (found(match), PLACEHOLDERS.ip) : match))
      .replace(IPV4, (match) => (found(match), PLACEHOLDERS.ip)),
  phone: (text, found) =>
    text.replace(PHONE, (match) => {
      const digits = match.replace(/\D/g, "");
      const international = /^(?:\+|00)/.test(match);
      if (digits.length > 15 || digits.length < (international ? 7 : 9)) return match;
      if (DATE_LIKE.test(match.trim())) return match;
      found(match.trim());
      return PLACEHOLDERS.phone;
    }),
};

// Specific formats first, so a card or an IBAN is not half-taken by the phone detector.
const ORDER: Detector[] = ["secret", "email", "iban", "card", "ip", "phone"];

/** Applies the switched-on built-in detectors to one text. */
export function redactBuiltIn(text: string, detectors: Record<Detector, boolean>): { text: string; redactions: number } {
  let redactions = 0;
  const found = () => void redactions++;
  for (const detector of ORDER) if (detectors[detector]) text = builtIns[detector](text, found);
  return { text, redactions };
}

/**
 * What each built-in placeholder stands for in `text` (every detector on), in the order found:
 * to read a model's answer about a text it saw redacted back into the text's own words.
 */
export function builtInValues(text: string): Map<string, string[]> {
  const values = new Map<string, string[]>();
  for (const detector of ORDER) {
    const placeholder = PLACEHOLDERS[detector];
    text = builtIns[detector](text, (value) => values.set(placeholder, [...(values.get(placeholder) ?? []), value]));
  }
  return values;
}

// ---------------------------------------------------------------------------------------------
// Custom patterns: RE2 syntax and semantics (re2js, a linear-time engine, so no pattern can
// backtrack catastrophically), run off the main thread under a time limit, fairly across tenants.

const require = createRequire(import.meta.url);
const RE2JS_PATH = require.resolve("re2js");

function re2Flags(flags: string): number {
  return (
    (flags.includes("i") ? RE2JS.CASE_INSENSITIVE : 0) |
    (flags.includes("m") ? RE2JS.MULTILINE : 0) |
    (flags.includes("s") ? RE2JS.DOTALL : 0)
  );
}

/** Why a custom pattern is refused, or null when it may be saved. */
export function customPatternProblem(pattern: string, flags: string): string | null {
  if (pattern.length === 0) return "the pattern is empty";
  if (pattern.length > CUSTOM_PATTERN_MAX_LENGTH) return `the pattern is longer than ${CUSTOM_PATTERN_MAX_LENGTH} characters`;
  if (!/^[imsu]*$/.test(flags)) return "flags may only be i, m, s and u";
  let compiled: RE2JS;
  try {
    compiled = RE2JS.compile(pattern, re2Flags(flags));
  } catch (error) {
    // RE2 has no backreferences or lookarounds: what cannot run in linear time is refused here.
    return `not a valid RE2 regular expression (no backreferences or lookarounds): ${(error as Error).message.replace(/^error parsing regexp: /, "")}`;
  }
  if (compiled.matcher("").find()) return "the pattern matches the empty string";
  return null;
}

// The worker applies patterns to texts and answers with the results; it holds only compiled patterns.
const WORKER_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const { RE2JS } = require(workerData.re2js);
const compiled = new Map();
const compile = (p) => {
  const key = p.flags + "/" + p.pattern;
  if (!compiled.has(key)) {
    const flags = (p.flags.includes("i") ? RE2JS.CASE_INSENSITIVE : 0) | (p.flags.includes("m") ? RE2JS.MULTILINE : 0) | (p.flags.includes("s") ? RE2JS.DOTALL : 0);
    if (compiled.size > 500) compiled.clear();
    compiled.set(key, RE2JS.compile(p.pattern, flags));
  }
  return compiled.get(key);
};
parentPort.on("message", ({ id, patterns, texts }) => {
  try {
    let redactions = 0;
    const out = texts.map((text) => {
      for (const p of patterns) text = compile(p).matcher(text).replaceAll(() => (redactions++, p.placeholder));
      return text;
    });
    parentPort.postMessage({ id, texts: out, redactions });
  } catch (error) {
    parentPort.postMessage({ id, error: String(error && error.message || error) });
  }
});
`;

type Job = {
  tenant: string;
  patterns: CustomPattern[];
  texts: string[];
  resolve(r: RedactionResult): void;
  reject(e: Error): void;
};

/** One worker thread; a job that runs past the time limit terminates it, and the next job starts a fresh one. */
class Slot {
  private worker?: Worker;
  private nextId = 0;
  busy = false;

  constructor(private readonly timeoutMs: (job: Job) => number) {}

  run(job: Job, done: () => void) {
    this.busy = true;
    const worker = (this.worker ??= new Worker(WORKER_SOURCE, { eval: true, workerData: { re2js: RE2JS_PATH } }));
    worker.ref();
    const id = this.nextId++;
    const limit = this.timeoutMs(job);
    const finish = (settle: () => void) => {
      clearTimeout(timer);
      worker.off("message", onMessage);
      worker.off("error", onError);
      this.busy = false;
      this.worker?.unref();
      settle();
      done();
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
      // The worker's own words stay with the error's cause (logged), not in what callers and job runs show.
      const failed = new EngramError("REDACTION_FAILED", "The redaction worker failed; nothing was sent to the model.");
      finish(() => job.reject(Object.assign(failed, { cause: error })));
    };
    const timer = setTimeout(() => {
      if (this.worker === worker) this.worker = undefined;
      void worker.terminate();
      finish(() =>
        job.reject(
          new EngramError(
            "REDACTION_FAILED",
            `Custom redaction patterns took longer than ${limit} ms; nothing was sent to the model. Simplify or remove the pattern.`,
          ),
        ),
      );
    }, limit);
    worker.on("message", onMessage);
    worker.on("error", onError);
    worker.postMessage({ id, patterns: job.patterns, texts: job.texts });
  }

  async close() {
    const worker = this.worker;
    this.worker = undefined;
    await worker?.terminate();
  }
}

/**
 * A few worker threads shared by all tenants, each tenant with its own queue, served round-robin:
 * a tenant with a flood of work waits behind itself, never in front of another tenant, which
 * waits at most for the jobs already running.
 */
export class CustomPatternPool {
  private readonly queues = new Map<string, Job[]>();
  private readonly turn: string[] = [];
  private readonly slots: Slot[];

  constructor(options: { workers?: number; timeoutMs?: number; msPerThousandChars?: number } = {}) {
    const base = options.timeoutMs ?? DEFAULT_CUSTOM_TIMEOUT_MS;
    const perThousand = options.msPerThousandChars ?? DEFAULT_MS_PER_THOUSAND_CHARS;
    // A linear engine's time grows with the text: the limit does too, so only a runaway is cut off.
    const timeoutMs = (job: Job) =>
      Math.round(base + (perThousand * job.texts.reduce((n, text) => n + text.length, 0) * job.patterns.length) / 1_000);
    this.slots = Array.from({ length: options.workers ?? 2 }, () => new Slot(timeoutMs));
  }

  run(tenant: string, patterns: CustomPattern[], texts: string[]): Promise<RedactionResult> {
    return new Promise((resolve, reject) => {
      const queue = this.queues.get(tenant);
      // Each text is matched whole (the engine is linear): a cut would let a match that straddles it through.
      const job = { tenant, patterns, texts, resolve, reject };
      if (queue) queue.push(job);
      else {
        this.queues.set(tenant, [job]);
        this.turn.push(tenant);
      }
      this.pump();
    });
  }

  async close() {
    await Promise.all(this.slots.map((slot) => slot.close()));
  }

  private pump() {
    for (const slot of this.slots) {
      if (slot.busy) continue;
      const tenant = this.turn.shift();
      if (tenant === undefined) return;
      const queue = this.queues.get(tenant)!;
      const job = queue.shift()!;
      // Back of the line for this tenant's next job, behind every other waiting tenant.
      if (queue.length) this.turn.push(tenant);
      else this.queues.delete(tenant);
      slot.run(job, () => this.pump());
    }
  }
}

let sharedPool: CustomPatternPool | undefined;

/**
 * The tenant's rules applied to texts bound for a model: built-in detectors in this thread, then
 * custom patterns in the worker pool under a time limit. A pattern that runs too long rejects
 * with REDACTION_FAILED and nothing is sent: failing closed keeps the call (and its job) waiting
 * instead of leaking what the pattern was meant to catch.
 */
export async function redactTexts(
  rules: RedactionRules,
  texts: string[],
  options: { tenant?: string; pool?: CustomPatternPool } = {},
): Promise<RedactionResult> {
  let redactions = 0;
  let out = texts.map((text) => {
    const result = redactBuiltIn(text, rules.detectors);
    redactions += result.redactions;
    return result.text;
  });
  if (rules.custom.length > 0) {
    const pool = options.pool ?? (sharedPool ??= new CustomPatternPool());
    const custom = await pool.run(options.tenant ?? "", rules.custom, out);
    out = custom.texts;
    redactions += custom.redactions;
  }
  return { texts: out, redactions };
}
