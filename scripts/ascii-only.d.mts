/** Makes a compiled file ASCII only; the line of a non-ASCII character it had to leave, or null. */
export function asciiOnly(file: string): { line: number } | null;
