// Part of the build (scripts/build.mjs): compiled files made ASCII only.
import { readFileSync, writeFileSync } from "node:fs";
import { parse } from "acorn";

const NON_ASCII = /[^\x00-\x7f]/;

/**
 * Leaves a compiled file ASCII only, so that Node keeps its source in memory at one byte a
 * character. V8 holds every module's source for as long as the process runs (it compiles functions
 * lazily from it), and one character outside Latin-1 anywhere in a file makes the whole string two
 * bytes a character: the server's chunks were 12 MB of heap, twice their size, because dependencies'
 * comments and a few regular expressions hold dashes, quotes and emoji. esbuild's `charset: "ascii"`
 * escapes strings but not comments, regular expressions or template literals. Here a comment's
 * characters become "?" (one per UTF-16 unit, so no column moves), a regular expression's become
 * \uXXXX escapes (the same pattern, with or without the u flag), and a template literal's are left,
 * and their line returned: a tag may read its raw text, where an escape would not mean the character.
 */
export function asciiOnly(file) {
  const source = readFileSync(file, "utf8");
  if (!/[^\x00-\x7f]/.test(source)) return null;
  const edits = [];
  const comments = [];
  const tokens = [];
  // A full parse, not the tokenizer alone: only the parser knows whether a slash starts a regular
  // expression everywhere (after `await`, say).
  parse(source, { ecmaVersion: "latest", sourceType: "module", allowHashBang: true, onToken: tokens, onComment: comments });
  for (const token of tokens) {
    if (token.type.label === "regexp" && /[^\x00-\x7f]/.test(source.slice(token.start, token.end))) {
      // Escapes are read whole: an escaped non-ASCII character is the character itself (an identity
      // escape, only without u), so backslash-dash becomes \u2013, not an escaped backslash and "u2013".
      const escaped = source
        .slice(token.start, token.end)
        .replace(/\\?[^\x00-\x7f]|\\[\s\S]/g, (match) => (NON_ASCII.test(match) ? `\\u${match.at(-1).charCodeAt(0).toString(16).padStart(4, "0")}` : match));
      edits.push({ start: token.start, end: token.end, text: escaped });
    }
  }
  for (const comment of comments) {
    const text = source.slice(comment.start, comment.end);
    if (/[^\x00-\x7f]/.test(text)) edits.push({ start: comment.start, end: comment.end, text: text.replace(/[^\x00-\x7f]/g, "?") });
  }
  edits.sort((a, b) => b.start - a.start);
  let out = source;
  for (const edit of edits) out = out.slice(0, edit.start) + edit.text + out.slice(edit.end);
  const left = out.search(/[^\x00-\x7f]/);
  writeFileSync(file, out);
  return left < 0 ? null : { line: out.slice(0, left).split("\n").length };
}
