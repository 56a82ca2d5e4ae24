// Ties a child store's life to the Engram process that started it. The child stops when:
// its IPC channel closes (the parent exited, even by SIGKILL), its parent pid changes (it was
// re-parented), or the parent asks. A SIGTERM/SIGINT/SIGHUP sent to the whole process group (the
// signals Engram stops on) gives the parent a few seconds to stop it in order, then it stops by itself.
export function watchParent(stop, { graceMs = 5_000 } = {}) {
  // A parent that died while this process loaded its modules is missed by both watches below: its
  // channel's "disconnect" came before the listener, and the ppid read here is already init's.
  if (typeof process.send === "function" && !process.connected) stop("Engram exited before this process started");
  const parent = process.ppid;
  process.on("message", (message) => {
    if (message === "stop") stop("asked by Engram");
  });
  process.on("disconnect", () => stop("Engram's IPC channel closed"));
  setInterval(() => {
    if (process.ppid !== parent) stop("Engram exited");
  }, 500).unref();
  const deferred = (signal) => () => {
    setTimeout(() => stop(signal), process.connected ? graceMs : 0).unref();
  };
  for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"]) process.on(signal, deferred(signal));
}
