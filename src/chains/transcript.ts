/** A conversation message as the chains see it. */
export type TranscriptMessage = { seq: number; role: string; content: string };

/** One line block per message, numbered by sequence so judges can point at them. */
export function formatTranscript(messages: TranscriptMessage[]): string {
  return messages.map((m) => `[#${m.seq}] ${m.role.toLowerCase()}: ${m.content.trim()}`).join("\n");
}

export function countWords(text: string): number {
  return text.trim() ? text.trim().split(/\s+/).length : 0;
}
