const LEVELS = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 } as const;
export type LogLevel = keyof typeof LEVELS;
export type Logger = Record<Exclude<LogLevel, "silent">, (message: string, fields?: object) => void>;

/** One line per record on stderr: time, level, message, then the fields as JSON. */
export function createLogger(level: LogLevel = "info"): Logger {
  const write = (at: Exclude<LogLevel, "silent">) => (message: string, fields?: object) => {
    if (LEVELS[at] < LEVELS[level]) return;
    const extra = fields ? ` ${JSON.stringify(fields, errorReplacer)}` : "";
    process.stderr.write(`${new Date().toISOString()} ${at.toUpperCase()} ${message}${extra}\n`);
  };
  return { debug: write("debug"), info: write("info"), warn: write("warn"), error: write("error") };
}

function errorReplacer(_key: string, value: unknown) {
  return value instanceof Error ? { name: value.name, message: value.message } : value;
}
