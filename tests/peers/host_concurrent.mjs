// A host made with the official TypeScript SDK's Client runs server_files.mjs (an SDK server
// whose tools call roots/list and every files/* method on the client) under `fsbroker proxy`.
//
// The host fires its own requests (ping, tools/list) while many tool calls are in flight, each
// of which makes the server send brokered requests, so requests in both directions interleave
// on both pipes. Every result must be correct, and the host must never see a `roots/list` or
// `files/*` request, nor a brokered notification: the broker answers them all.
//
// Prints one JSON summary line and exits 0, or exits 1 with a message on stderr.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ErrorCode, McpError } from "@modelcontextprotocol/sdk/types.js";
import {
  HERE,
  brokered,
  captureExit,
  check,
  env,
  installedVersion,
  recordInbound,
  toolText,
  tomlString,
  watchdog,
} from "./lib.mjs";

const stopWatchdog = watchdog(55, "host_concurrent");
const BIN = env("FSBROKER_BIN");
const TMP = env("PEERS_TMPDIR");

// Error numbers of the wire contract (docs/protocol.md, "Errors").
const FILE_NOT_FOUND = -31001;
const PERMISSION_DENIED = -31002;
const IO_ERROR = -31004;
const ALREADY_EXISTS = -31009;

// The fixture: a writable root, a read-only root behind a consent prompt, a directory outside.
const work = path.join(TMP, "work");
const gated = path.join(TMP, "gated");
const outside = path.join(TMP, "outside");
const HELLO = "hello, brokered world ✓\n";
for (const d of ["list", "w0", "w1"]) fs.mkdirSync(path.join(work, d), { recursive: true });
for (const d of ["yes", "no"]) fs.mkdirSync(path.join(gated, d), { recursive: true });
fs.mkdirSync(outside, { recursive: true });
fs.writeFileSync(path.join(work, "hello.txt"), HELLO);
fs.writeFileSync(path.join(work, "locked.txt"), "lock me\n");
for (const n of ["c.txt", "a.txt", "b.txt"]) fs.writeFileSync(path.join(work, "list", n), n);
fs.writeFileSync(path.join(gated, "yes", "a.txt"), "approved\n");
fs.writeFileSync(path.join(gated, "no", "b.txt"), "refused\n");
fs.writeFileSync(path.join(outside, "secret.txt"), "top secret\n");

const consentLog = path.join(TMP, "consent-requests.jsonl");
const policyFile = path.join(TMP, "policy.toml");
fs.writeFileSync(
  policyFile,
  `[[root]]
path = ${tomlString(work)}
name = "work"
mode = "read-write"
consent = "auto"

[[root]]
path = ${tomlString(gated)}
name = "gated"
mode = "read-only"
consent = "prompt"

[consent]
command = [${[process.execPath, path.join(HERE, "consent.mjs"), consentLog].map(tomlString).join(", ")}]
terminal = false
timeout_ms = 20000

[limits]
requests_per_second = 0
`,
);

const transport = new StdioClientTransport({
  command: BIN,
  args: ["proxy", "--policy", policyFile, "--", process.execPath, path.join(HERE, "server_files.mjs")],
  cwd: TMP,
  stderr: "inherit",
  env: { RUST_LOG: process.env.RUST_LOG ?? "warn" },
});
const inbound = recordInbound(transport);
const client = new Client({ name: "fsbroker-peer-host-concurrent", version: "0.0.0" }, { capabilities: {} });
const unexpected = [];
client.fallbackRequestHandler = async (request) => {
  unexpected.push(request.method);
  throw new McpError(ErrorCode.MethodNotFound, `the host has no handler for ${request.method}`);
};
client.fallbackNotificationHandler = async (n) => {
  if (brokered(n.method)) unexpected.push(n.method);
};
await client.connect(transport);
const proxy = captureExit(transport);

// Every host request goes through `track`, to show how many were in flight at once.
let inFlight = 0;
let maxInFlight = 0;
let hostRequests = 0;
async function track(promise) {
  inFlight++;
  hostRequests++;
  maxInFlight = Math.max(maxInFlight, inFlight);
  try {
    return await promise;
  } finally {
    inFlight--;
  }
}
async function tool(name, args = {}) {
  const r = await track(client.callTool({ name, arguments: args }));
  check(!r.isError, `tool ${name} failed`, r);
  return JSON.parse(toolText(r));
}
let brokeredCalls = 0;
async function req(method, params) {
  brokeredCalls++;
  return tool("request", params === undefined ? { method } : { method, params });
}
function result(r, what) {
  check(r && r.result !== undefined && r.error === undefined, `${what}: expected a result`, r);
  return r.result;
}
function error(r, code, what) {
  check(r && r.error && r.error.code === code, `${what}: expected error ${code}`, r);
  return r.error;
}
const real = (p) => fs.realpathSync(p);

/** A process's thread names (Linux), for diagnostics. */
function threadNames(pid) {
  try {
    const dir = `/proc/${pid}/task`;
    const names = fs.readdirSync(dir).map((t) => fs.readFileSync(`${dir}/${t}/comm`, "utf8").trim());
    return [...new Set(names)].sort();
  } catch (e) {
    return String(e);
  }
}

// Only what the session may use now: `work` (auto), and once files/consent (running at the
// same time) has granted it, `gated/yes`; never the ungranted rest of the prompt root `gated`.
function checkRoots(r, what) {
  const roots = result(r, what).roots;
  const got = roots.map((x) => [x.name, fileURLToPath(x.uri)]).sort();
  const before = [["work", real(work)]];
  const after = [["gated/yes", real(path.join(gated, "yes"))], ["work", real(work)]];
  check(
    JSON.stringify(got) === JSON.stringify(before) || JSON.stringify(got) === JSON.stringify(after),
    `${what}: the broker's roots`,
    { got, before, after },
  );
  check(roots.every((x) => !x.uri.endsWith("/")), `${what}: no trailing slash in root URIs`, roots);
}

function checkHello(r, what) {
  const x = result(r, what);
  const size = Buffer.byteLength(HELLO);
  check(
    x.content === HELLO && x.encoding === "utf-8" && x.size === size && x.offset === 0 && x.length === size && x.eof === true,
    `${what}: files/read of work/hello.txt`,
    x,
  );
}

// --- What the server saw of the handshake -------------------------------------------------
// On the wire, the proxy's rewrite; through the SDK's typed view, at least `listChanged` (its
// schema drops `roots` members it does not know, `filesystemBrokering` among them).
const caps = await tool("client_caps");
check(
  Object.keys(caps.raw ?? {}).join() === "roots" &&
    Object.keys(caps.raw.roots).sort().join() === "filesystemBrokering,listChanged" &&
    caps.raw.roots.listChanged === true &&
    caps.raw.roots.filesystemBrokering === true,
  "the server should receive the host's capabilities (none) plus roots {listChanged, filesystemBrokering}",
  caps,
);
check(caps.parsed?.roots?.listChanged === true, "the SDK server should see roots.listChanged", caps);
checkRoots(await tool("early_roots"), "roots/list sent during the handshake");

// --- Chains of dependent calls, run side by side ------------------------------------------

/** write, read, create, rename, list, delete in a directory of its own. */
async function mutations(i) {
  const dir = `work/m${i}`;
  const text = `round ${i} ✓ ${"x".repeat(i * 100)}`;
  check(result(await req("files/create", { path: `${dir}/sub`, type: "directory" }), "create").created === true, `create ${dir}/sub`);
  check(result(await req("files/create", { path: `${dir}/sub`, type: "directory" }), "create again").created === false, `create ${dir}/sub again`);
  const w = result(await req("files/write", { path: `${dir}/t.txt`, content: text }), "write");
  check(w.bytesWritten === Buffer.byteLength(text) && w.size === Buffer.byteLength(text), `write ${dir}/t.txt`, w);
  check(result(await req("files/read", { path: `${dir}/t.txt` }), "read back").content === text, `read back ${dir}/t.txt`);
  check(fs.readFileSync(path.join(work, `m${i}`, "t.txt"), "utf8") === text, `${dir}/t.txt on disk`);
  check(result(await req("files/create", { path: `${dir}/empty.txt`, type: "file" }), "create file").created === true, `create ${dir}/empty.txt`);
  result(await req("files/rename", { oldPath: `${dir}/t.txt`, newPath: `${dir}/u.txt` }), `rename ${dir}/t.txt`);
  error(await req("files/rename", { oldPath: `${dir}/empty.txt`, newPath: `${dir}/u.txt` }), ALREADY_EXISTS, `rename onto ${dir}/u.txt`);
  const listed = result(await req("files/list", { path: dir }), `list ${dir}`).entries;
  check(
    JSON.stringify(listed.map((e) => [e.name, e.path, e.type])) ===
      JSON.stringify([["empty.txt", `${dir}/empty.txt`, "file"], ["sub", `${dir}/sub`, "directory"], ["u.txt", `${dir}/u.txt`, "file"]]),
    `files/list ${dir}`,
    listed,
  );
  result(await req("files/delete", { path: `${dir}/u.txt` }), `delete ${dir}/u.txt`);
  error(await req("files/read", { path: `${dir}/u.txt` }), FILE_NOT_FOUND, `read deleted ${dir}/u.txt`);
  error(await req("files/delete", { path: dir }), IO_ERROR, `delete non-empty ${dir} without recursive`);
  result(await req("files/delete", { path: dir, recursive: true }), `delete ${dir} recursively`);
  check(!fs.existsSync(path.join(work, `m${i}`)), `${dir} still on disk after delete`);
  return i;
}

/** files/consent on the prompt root: nothing before, the approved subset after. */
async function consent() {
  const before = error(await req("files/read", { path: "gated/yes/a.txt" }), PERMISSION_DENIED, "read before consent");
  check(/consent/.test(before.data?.reason ?? ""), "the refusal before consent should say no consent", before);
  const c = result(
    await req("files/consent", { message: "the peer test wants gated/yes", requestedPaths: ["gated/yes", "gated/no"] }),
    "files/consent",
  );
  check(c.granted === true && JSON.stringify(c.approvedPaths) === JSON.stringify([real(path.join(gated, "yes"))]), "files/consent approves gated/yes only", c);
  check(result(await req("files/read", { path: "gated/yes/a.txt" }), "read after consent").content === "approved\n", "read gated/yes/a.txt after consent");
  error(await req("files/read", { path: "gated/no/b.txt" }), PERMISSION_DENIED, "read of the refused gated/no/b.txt");
  error(await req("files/write", { path: "gated/yes/new.txt", content: "x" }), PERMISSION_DENIED, "write to the read-only root");
  return c;
}

/** keepLocked, then files/unlock. */
async function lock() {
  const r = result(await req("files/read", { path: "work/locked.txt", keepLocked: true }), "read keepLocked");
  check(typeof r.lockId === "string" && r.content === "lock me\n", "files/read keepLocked gives a lockId", r);
  result(await req("files/unlock", { lockId: r.lockId }), "files/unlock");
  return true;
}

async function refusals() {
  const a = error(await req("files/read", { path: path.join(outside, "secret.txt") }), PERMISSION_DENIED, "read outside by absolute path");
  error(await req("files/read", { path: "work/../outside/secret.txt" }), PERMISSION_DENIED, "read outside by ..");
  error(await req("files/read", { path: "work/missing.txt" }), FILE_NOT_FOUND, "read of a missing file");
  check(!JSON.stringify(a).includes("top secret"), "a refusal leaks the content", a);
  return a.data?.code;
}

async function list() {
  const entries = result(await req("files/list", { path: "work/list" }), "files/list work/list").entries;
  check(
    JSON.stringify(entries.map((e) => [e.name, e.path, e.type, e.size])) ===
      JSON.stringify([["a.txt", "work/list/a.txt", "file", 5], ["b.txt", "work/list/b.txt", "file", 5], ["c.txt", "work/list/c.txt", "file", 5]]),
    "files/list work/list",
    entries,
  );
  return entries.length;
}

async function watch(k) {
  const dir = `work/w${k}`;
  const r = await tool("watch_roundtrip", { dir, name: "f.txt", content: `watched ${k}` });
  brokeredCalls += 4;
  for (const s of r.steps) check(s.result !== undefined, `watch_roundtrip ${dir}: ${s.label}`, r);
  check(r.steps.length === 4, `watch_roundtrip ${dir}: four steps`, r);
  const c = r.change;
  // On failure, the proxy's threads show whether the broker's watch machinery is running.
  if (!c) r.proxyThreads = threadNames(transport.pid);
  check(c && ["created", "modified"].includes(c.event) && typeof c.timestamp === "string", `watch_roundtrip ${dir}: notifications/files/changed`, r);
  check(r.afterUnwatch == null, `watch_roundtrip ${dir}: a notification arrived after files/unwatch`, r);
  return c.event;
}

async function burst(n) {
  const all = await tool("burst", { n, path: "work/hello.txt" });
  brokeredCalls += n;
  check(all.length === n, "burst: every answer", all.length);
  all.forEach((r, i) => (i % 2 ? checkRoots(r, `burst #${i}`) : checkHello(r, `burst #${i}`)));
  return n;
}

const started = Date.now();
const jobs = [];
for (let i = 0; i < 60; i++) jobs.push(track(client.ping()).then(() => "ping"));
for (let i = 0; i < 10; i++)
  jobs.push(
    track(client.listTools()).then((t) => {
      check(t.tools.some((x) => x.name === "request"), "tools/list", t);
      return "tools/list";
    }),
  );
for (let i = 0; i < 12; i++) jobs.push(req("files/read", { path: "work/hello.txt" }).then((r) => checkHello(r, `read #${i}`)));
for (let i = 0; i < 6; i++) jobs.push(req("roots/list").then((r) => checkRoots(r, `roots/list #${i}`)));
for (let i = 0; i < 4; i++) jobs.push(mutations(i));
for (let k = 0; k < 2; k++) jobs.push(watch(k));
for (let k = 0; k < 2; k++) jobs.push(burst(40));
jobs.push(consent(), lock(), refusals(), list());
await Promise.all(jobs);
const elapsedMs = Date.now() - started;

// The consent command was asked twice: on the server's first roots/list, about the prompt
// root as a whole (refused), then by files/consent, with the server's name (learnt from its
// initialize answer) and the canonical paths.
const asked = fs.readFileSync(consentLog, "utf8").trim().split("\n").map((l) => JSON.parse(l));
check(
  asked.length === 2 &&
    /roots\/list/.test(asked[0].message) &&
    JSON.stringify(asked[0].requestedPaths) === JSON.stringify([real(gated)]) &&
    asked[1].server === "fsbroker-peer-files-server" &&
    JSON.stringify(asked[1].requestedPaths) === JSON.stringify([real(path.join(gated, "yes")), real(path.join(gated, "no"))]),
  "the consent command's requests",
  asked,
);

// Nothing brokered reached the host: only answers to its own requests (and nothing else).
const leaked = inbound.filter((m) => brokered(m.method));
const requestsToHost = inbound.filter((m) => m.method !== undefined && m.id !== undefined).map((m) => m.method);
const notResponses = inbound.filter((m) => m.method !== undefined || m.id === undefined);
check(notResponses.length === 0 && inbound.length === hostRequests + 1, "the host should receive exactly the answers to its own requests (and to initialize)", {
  received: inbound.length,
  sent: hostRequests + 1,
  notResponses,
});
check(leaked.length === 0 && unexpected.length === 0 && requestsToHost.length === 0, "the host received brokered messages", {
  leaked,
  unexpected,
  requestsToHost,
});

await client.close();
await Promise.race([proxy.exited, new Promise((r) => setTimeout(r, 6000))]);
check(
  proxy.state.signal == null && proxy.state.code === 0,
  "the proxy did not exit 0 by itself after the host closed its stdin",
  proxy.state,
);

stopWatchdog();
console.log(
  JSON.stringify({
    test: "host_concurrent",
    ok: true,
    versions: {
      node: process.version,
      "@modelcontextprotocol/sdk": installedVersion("@modelcontextprotocol/sdk"),
      zod: installedVersion("zod"),
    },
    hostRequests,
    maxInFlight,
    brokeredRequestsFromServer: brokeredCalls + 1, // + the handshake's roots/list
    hostMessagesReceived: inbound.length,
    elapsedMs,
    proxyExit: proxy.state,
  }),
);
process.exit(0);
