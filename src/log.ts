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

/**
 * A log line said at most once every `everyMs`, however often it happens: a repeating failure (a
 * store away, an encoder down) must not flood the log. The next line counts those left unsaid.
 */
export function sparingly(log: Logger, level: Exclude<LogLevel, "silent" | "debug">, message: string, everyMs: number) {
  let saidAt = -Infinity;
  let unsaid = 0;
  return (fields?: object) => {
    const now = Date.now();
    if (now - saidAt < everyMs) {
      unsaid++;
      return;
    }
    saidAt = now;
    log[level](message, unsaid ? { ...fields, sinceLast: unsaid } : fields);
    unsaid = 0;
  };
}
