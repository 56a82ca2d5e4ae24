/** A fact's text as compared for sameness: case, punctuation and spacing aside. */
export const normalizeFact = (text: string) =>
  text.toLowerCase().replace(/[^\p{L}\p{N}]+/gu, " ").trim();
