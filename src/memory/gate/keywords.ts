/**
 * The keyword gate for recall, used when no model gives the per-turn verdict. Most messages do
 * not need earlier conversations; these phrases are the ones that usually do:
 *
 * - references to an earlier time: "last time", "the other day", "before", "previously",
 *   "as before", "as usual", "like last week", "a while ago", "earlier conversation";
 * - asking to repeat: "again", "same as", "the same one", "reorder", "one more time";
 * - habits and possessions: "my usual", "my regular", "my favourite", "the one I always get";
 * - past orders and bookings: "my (last|previous|past) order", "I ordered", "I bought", "I booked";
 * - memory: "remember when", "do you remember", "you told me", "I told you", "we talked about",
 *   "we discussed", "you recommended", "you suggested", "I mentioned".
 *
 * Deliberately generous: a false positive costs one embedding and a search, a false negative
 * costs the user repeating themselves.
 */
const PATTERNS: RegExp[] = [
  /\blast\s+(?:time|week|month|year|visit|order|trip|session|conversation|chat)\b/,
  /\b(?:the\s+other\s+day|a\s+while\s+(?:ago|back)|some\s+time\s+ago|previously|earlier\s+(?:conversation|chat|today|this\s+week))\b/,
  /\b(?:as|like)\s+(?:before|usual|last\s+\w+|always|we\s+(?:did|said|agreed))\b/,
  /\b(?:again|once\s+more|one\s+more\s+time|re-?order|re-?book|same\s+as|the\s+same\s+(?:one|thing|as|order|place|again))\b/,
  /\bmy\s+(?:usual|regular|normal|favou?rite|go-to|standard)\b/,
  /\bthe\s+one\s+i\s+(?:always|usually|had|got|liked|ordered|bought)\b/,
  /\b(?:my|our)\s+(?:last|previous|past|earlier|old)\s+\w+/,
  /\bi\s+(?:ordered|bought|booked|reserved|purchased|had|tried|got)\b.*\b(?:before|last|ago|previously|then)\b/,
  /\b(?:remember\s+(?:when|what|that|the|my|how)|do\s+you\s+remember|you\s+remember|recall\s+(?:when|what|that|the|my))\b/,
  /\b(?:you\s+(?:told|showed|sent|gave|recommended|suggested|mentioned|said)|i\s+(?:told\s+you|mentioned|said\s+(?:before|earlier)))\b/,
  /\bwe\s+(?:talked|spoke|discussed|chatted|agreed|decided)\b/,
  /\bwhen\s+did\s+i\b/,
  /\bwhat\s+(?:did|was)\s+(?:i|my|we)\b.*\b(?:before|last|ago|previously|then|get|order|buy|book|pick|choose)\b/,
];

/** Whether a message probably needs the user's earlier conversations (see the list above). */
export function needsRecallByKeywords(message: string): boolean {
  const text = message.toLowerCase().replace(/[’']/g, "'");
  return PATTERNS.some((pattern) => pattern.test(text));
}
