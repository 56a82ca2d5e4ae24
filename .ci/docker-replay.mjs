// Replays the Dockerfile's build steps in a clean folder, as `docker build` would (no daemon
// runs on CI machines here), then runs its CMD and checks /readyz and a clean SIGTERM stop.
// Also runs the compose healthcheck of Chroma (a bash /dev/tcp probe) against a local Chroma.
// Understands the instructions our Dockerfile uses: FROM, WORKDIR, USER, COPY, RUN, ENV, EXPOSE, HEALTHCHECK, CMD.
import { spawn, spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parse as parseYaml } from "yaml";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const say = (line) => process.stdout.write(`docker-replay: ${line}\n`);
const fail = (line) => {
  process.stderr.write(`docker-replay: FAILED: ${line}\n`);
  process.exit(1);
};

// --- the build context: the files git knows (tracked or new), minus .dockerignore ---
const globToRegExp = (glob) =>
  new RegExp(`^${glob.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*\*/g, "\u0000").replace(/\*/g, "[^/]*").replace(/\?/g, "[^/]").replace(/\u0000/g, ".*")}(/.*)?$`);
const ignored = readFileSync(path.join(root, ".dockerignore"), "utf8")
  .split("\n")
  .map((line) => line.trim())
  .filter((line) => line && !line.startsWith("#"))
  .map((line) => globToRegExp(line.replace(/^\/+|\/+$/g, "")));
const listed = spawnSync("git", ["ls-files", "-co", "--exclude-standard"], { cwd: root, encoding: "utf8" });
if (listed.status !== 0) fail(`git ls-files: ${listed.stderr}`);
const context = listed.stdout
  .split("\n")
  .filter(Boolean)
  .filter((file) => !ignored.some((pattern) => pattern.test(file)))
  .filter((file) => {
    try {
      return statSync(path.join(root, file)).isFile();
    } catch {
      return false; // deleted in the work tree
    }
  });

// --- the Dockerfile's instructions ---
const instructions = readFileSync(path.join(root, "Dockerfile"), "utf8")
  .replace(/\\\n/g, " ")
  .split("\n")
  .map((line) => line.trim())
  .filter((line) => line && !line.startsWith("#"))
  .map((line) => {
    const [, op, rest] = /^(\w+)\s+(.*)$/.exec(line) ?? fail(`cannot read "${line}"`);
    return { op: op.toUpperCase(), rest: rest.trim() };
  });

const build = mkdtempSync(path.join(tmpdir(), "engram-docker-"));
let workdir = build;
const env = { ...process.env };
for (const key of Object.keys(env)) if (key.startsWith("npm_") || key === "NODE_ENV") delete env[key];
// An image's build has an npm cache of its own, which its RUN steps may clear (`npm cache clean`):
// here that is a folder in the build, seeded with hard links to this machine's cache (so nothing
// is downloaded again, and clearing it unlinks only the build's links, never the machine's cache).
const npmCache = path.join(build, ".npm-cache");
const hostCache = spawnSync("npm", ["config", "get", "cache"], { encoding: "utf8" }).stdout.trim();
if (hostCache && existsSync(path.join(hostCache, "_cacache"))) {
  mkdirSync(npmCache);
  const linked = spawnSync("cp", ["-al", path.join(hostCache, "_cacache"), npmCache], { encoding: "utf8" });
  if (linked.status !== 0) say(`the npm cache is not linked (${linked.stderr.trim()}): packages are downloaded again`);
}
env.npm_config_cache = npmCache;
let cmd;
let healthcheck;

for (const { op, rest } of instructions) {
  if (op === "FROM") {
    say(`FROM ${rest} (using this machine's node ${process.version})`);
    // The official node images come with an unprivileged `node` user; this machine may not.
    if (rest.startsWith("node:") && spawnSync("id", ["node"]).status !== 0) {
      const made = spawnSync("useradd", ["--system", "--user-group", "--no-create-home", "node"], { encoding: "utf8" });
      if (made.status !== 0) fail(`the node image's user is missing here and could not be made: ${made.stderr}`);
      say("made the node image's `node` user on this machine");
    }
  }
  else if (op === "WORKDIR") {
    workdir = path.join(build, rest);
    mkdirSync(workdir, { recursive: true });
  } else if (op === "USER" || op === "EXPOSE") say(`${op} ${rest} (not replayed)`);
  else if (op === "COPY") {
    const args = rest.split(/\s+/).filter((arg) => !arg.startsWith("--"));
    const destArg = args.pop();
    const dest = path.resolve(workdir, destArg);
    const intoDir = destArg.endsWith("/") || destArg === "." || args.length > 1;
    for (const source of args) {
      const prefix = source.replace(/^\.\/?/, "").replace(/\/+$/, "");
      const copy = (file, target) => {
        mkdirSync(path.dirname(target), { recursive: true });
        cpSync(path.join(root, file), target);
      };
      if (context.includes(prefix)) copy(prefix, intoDir ? path.join(dest, path.basename(prefix)) : dest);
      else {
        const files = context.filter((file) => prefix === "" || file.startsWith(`${prefix}/`));
        if (!files.length) fail(`COPY ${source}: nothing in the build context`);
        for (const file of files) copy(file, path.join(dest, prefix === "" ? file : file.slice(prefix.length + 1)));
      }
    }
    say(`COPY ${rest}`);
  } else if (op === "RUN") {
    say(`RUN ${rest}`);
    const result = spawnSync("bash", ["-c", rest], { cwd: workdir, env, stdio: "inherit" });
    if (result.status !== 0) fail(`RUN ${rest} exited with ${result.status}`);
  } else if (op === "ENV") {
    for (const [, key, value] of rest.matchAll(/(\w+)=("[^"]*"|\S+)/g)) env[key] = value.replace(/^"|"$/g, "");
  } else if (op === "CMD") cmd = JSON.parse(rest);
  else if (op === "HEALTHCHECK") {
    // HEALTHCHECK [--option=value …] CMD ["exec", "form"]: run against the server below.
    const exec = /^(?:--[\w-]+=\S+\s+)*CMD\s+(\[.*\])$/.exec(rest);
    if (!exec) fail(`HEALTHCHECK ${rest}: not options then CMD in exec form`);
    healthcheck = JSON.parse(exec[1]);
  } else fail(`the replay does not know ${op}`);
}
if (!cmd) fail("no CMD");
for (const bad of ["npm", "npx", "sh", "bash"]) if (cmd[0] === bad) fail(`CMD starts with ${bad}: run node directly`);

const freePort = () =>
  new Promise((resolve) => {
    const server = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
const until = async (what, probe, ms) => {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await probe().catch(() => false)) return;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  fail(`timed out waiting for ${what}`);
};

// --- run the image's CMD (embedded store in a temp folder) ---
const port = await freePort();
const dataDir = mkdtempSync(path.join(tmpdir(), "engram-docker-data-"));
say(`CMD ${cmd.join(" ")} on port ${port}`);
const server = spawn(cmd[0] === "node" ? process.execPath : cmd[0], cmd.slice(1), {
  cwd: workdir,
  env: { ...env, HOST: "127.0.0.1", PORT: String(port), ENGRAM_DATA_DIR: dataDir, ENGRAM_LOG_LEVEL: "warn" },
  stdio: ["ignore", "inherit", "inherit"],
});
const exited = new Promise((resolve) => server.once("exit", (code, signal) => resolve({ code, signal })));
await until("/readyz to answer 200", async () => (await fetch(`http://127.0.0.1:${port}/readyz`)).ok, 120_000);
say("/readyz answers 200");

// The compose healthcheck of the engram service, as written there, against this server.
const compose = parseYaml(readFileSync(path.join(root, "docker-compose.yml"), "utf8"));
const probe = (test, from, to) => {
  const [kind, ...argv] = test;
  if (kind !== "CMD") fail(`healthcheck ${test} is not a CMD list`);
  const args = argv.map((arg) => arg.replaceAll(from, to));
  const bin = args[0] === "node" ? process.execPath : args[0];
  return spawnSync(bin, args.slice(1), { encoding: "utf8", timeout: 10_000 }).status === 0;
};
if (!probe(compose.services.engram.healthcheck.test, "127.0.0.1:4000", `127.0.0.1:${port}`)) fail("the engram healthcheck fails");
say("compose healthcheck of engram passes");
// The image's own HEALTHCHECK, with the image's environment (its PORT).
if (!healthcheck) fail("the Dockerfile has no HEALTHCHECK");
{
  const [bin, ...args] = healthcheck;
  const ran = spawnSync(bin === "node" ? process.execPath : bin, args, { encoding: "utf8", timeout: 10_000, env: { ...env, PORT: String(port) } });
  if (ran.status !== 0) fail(`the image's HEALTHCHECK fails: ${ran.stderr}`);
}
say("the image's HEALTHCHECK passes");

server.kill("SIGTERM");
const stop = await Promise.race([exited, new Promise((resolve) => setTimeout(() => resolve(null), 15_000))]);
if (!stop) {
  server.kill("SIGKILL");
  fail("the server did not stop within 15 s of SIGTERM");
}
if (stop.code !== 0) fail(`the server exited with ${stop.code ?? stop.signal} after SIGTERM`);
say("SIGTERM: stopped with code 0");

// --- the Chroma healthcheck, against a local Chroma of the same npm package ---
const chromaPort = await freePort();
const chromaDir = mkdtempSync(path.join(tmpdir(), "engram-docker-chroma-"));
const chroma = spawn(path.join(root, "node_modules", ".bin", "chroma"), ["run", "--path", chromaDir, "--host", "127.0.0.1", "--port", String(chromaPort)], {
  stdio: "ignore",
});
try {
  await until("a local Chroma", async () => (await fetch(`http://127.0.0.1:${chromaPort}/api/v2/heartbeat`)).ok, 60_000);
  if (!probe(compose.services.chroma.healthcheck.test, "/8000", `/${chromaPort}`)) fail("the chroma healthcheck fails against a live Chroma");
  say("compose healthcheck of chroma passes against a live Chroma");
} finally {
  if (chroma.exitCode === null && chroma.signalCode === null) {
    chroma.kill("SIGKILL");
    await new Promise((resolve) => chroma.once("exit", resolve));
  }
}
if (probe(compose.services.chroma.healthcheck.test, "/8000", `/${chromaPort}`)) fail("the chroma healthcheck passes with Chroma stopped");
say("compose healthcheck of chroma fails with Chroma stopped, as it should");

rmSync(dataDir, { recursive: true, force: true });
rmSync(chromaDir, { recursive: true, force: true });
rmSync(build, { recursive: true, force: true });
say("ok");
