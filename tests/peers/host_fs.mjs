// A host made with the official TypeScript SDK's Client (declaring no roots of its own) runs
// the reference filesystem server, without directory arguments, under `fsbroker proxy`.
//
// The proxy declares roots for the host, so the server asks `roots/list` after initialization
// and the broker answers: the server's `list_allowed_directories` must report exactly the
// policy's roots. Editing the policy (a new file renamed over it) makes the proxy send
// `notifications/roots/list_changed`; the server asks again and reports the new set. Its
// read tool works inside the roots and fails outside. Nothing brokered reaches the host.
//
// Prints one JSON summary line and exits 0, or exits 1 with a message on stderr.
import fs from "node:fs";
import path from "node:path";
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
  poll,
  recordInbound,
  replaceFile,
  toolText,
  tomlString,
  watchdog,
} from "./lib.mjs";

const stopWatchdog = watchdog(55, "host_fs");
const BIN = env("FSBROKER_BIN");
const TMP = env("PEERS_TMPDIR");
const SERVER = path.join(HERE, "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
check(fs.existsSync(SERVER), `${SERVER} is missing: run npm ci --prefix tests/peers`);

// The fixture: two roots (the second one's path has a space: a percent-encoded URI) and a
// directory outside every root.
const alpha = path.join(TMP, "alpha");
const beta = path.join(TMP, "beta dir");
const outside = path.join(TMP, "outside");
for (const d of [alpha, beta, outside]) fs.mkdirSync(d, { recursive: true });
const ALPHA_TEXT = "hello from alpha\nsecond line ✓\n";
const BETA_TEXT = "hello from beta\n";
fs.writeFileSync(path.join(alpha, "inside.txt"), ALPHA_TEXT);
fs.writeFileSync(path.join(beta, "b.txt"), BETA_TEXT);
fs.writeFileSync(path.join(outside, "secret.txt"), "top secret\n");

const policyFile = path.join(TMP, "policy.toml");
const policy = (roots) =>
  roots
    .map(
      ([name, dir]) =>
        `[[root]]\npath = ${tomlString(dir)}\nname = ${tomlString(name)}\nmode = "read-only"\nconsent = "auto"\n`,
    )
    .join("\n");
fs.writeFileSync(policyFile, policy([["alpha", alpha]]));

const transport = new StdioClientTransport({
  command: BIN,
  args: ["proxy", "--policy", policyFile, "--", process.execPath, SERVER],
  cwd: TMP,
  stderr: "inherit",
  env: { RUST_LOG: process.env.RUST_LOG ?? "warn" },
});
const inbound = recordInbound(transport);
const client = new Client({ name: "fsbroker-peer-host-fs", version: "0.0.0" }, { capabilities: {} });
const unexpected = [];
client.fallbackRequestHandler = async (request) => {
  unexpected.push(request.method);
  throw new McpError(ErrorCode.MethodNotFound, `the host has no handler for ${request.method}`);
};
await client.connect(transport);
const proxy = captureExit(transport);
const server = client.getServerVersion();

/** The server's allowed directories, sorted. */
async function allowed() {
  const r = await client.callTool({ name: "list_allowed_directories", arguments: {} });
  check(!r.isError, "list_allowed_directories failed", r);
  const lines = toolText(r).split("\n");
  check(lines[0] === "Allowed directories:", "unexpected list_allowed_directories output", r);
  return lines.slice(1).filter((l) => l !== "").sort();
}

/** Waits (at most 10 s) until the server reports exactly `dirs`; returns the wait in ms. */
async function expectAllowed(dirs, when) {
  const want = dirs.map((d) => fs.realpathSync(d)).sort();
  const start = Date.now();
  const last = await poll(10_000, async () => {
    const got = await allowed();
    return { ok: JSON.stringify(got) === JSON.stringify(want), got };
  });
  check(last.ok, `${when}: the server's allowed directories are not the broker's roots`, {
    want,
    got: last.got,
  });
  return { dirs: want, waitedMs: Date.now() - start };
}

const tools = (await client.listTools()).tools.map((t) => t.name);
const readTool = ["read_text_file", "read_file"].find((n) => tools.includes(n));
check(readTool, "the server has no text read tool", tools);
check(tools.includes("list_allowed_directories"), "the server has no list_allowed_directories", tools);

async function read(file) {
  const r = await client.callTool({ name: readTool, arguments: { path: file } });
  return { isError: r.isError === true, text: toolText(r) };
}
async function expectRead(file, want) {
  const r = await read(file);
  check(!r.isError && r.text === want, `${readTool} ${file} should return the file's content`, { want, got: r });
}
async function expectRefused(file, secret) {
  const r = await read(file);
  check(r.isError, `${readTool} ${file} should fail: it is outside every root`, r);
  check(!secret || !r.text.includes(secret), `the refusal for ${file} leaks the file's content`, r);
  return r.text;
}

// 1. The initial roots: exactly the policy's.
const initial = await expectAllowed([alpha], "at start");
await expectRead(path.join(alpha, "inside.txt"), ALPHA_TEXT);
const outsideError = await expectRefused(path.join(outside, "secret.txt"), "top secret");
await expectRefused(path.join(beta, "b.txt"), BETA_TEXT);
// `..` out of a root is outside too.
await expectRefused(path.join(alpha, "..", "outside", "secret.txt"), "top secret");

// 2. Add a root by editing the policy: list_changed, the server re-asks, reports both.
replaceFile(policyFile, policy([["alpha", alpha], ["beta", beta]]));
const added = await expectAllowed([alpha, beta], "after adding a root to the policy");
await expectRead(path.join(beta, "b.txt"), BETA_TEXT);
await expectRead(path.join(alpha, "inside.txt"), ALPHA_TEXT);

// 3. Remove the first root: the server follows again, and its files are out of reach.
replaceFile(policyFile, policy([["beta", beta]]));
const removed = await expectAllowed([beta], "after removing a root from the policy");
await expectRefused(path.join(alpha, "inside.txt"), "hello from alpha");
await expectRead(path.join(beta, "b.txt"), BETA_TEXT);

// Nothing the broker answers ever reached the host.
const leaked = inbound.filter((m) => brokered(m.method));
check(leaked.length === 0 && unexpected.length === 0, "the host received brokered messages", {
  leaked,
  unexpected,
});

// The host closes its end: the proxy must shut the server down and exit by itself (the SDK
// sends SIGTERM after 2 s otherwise, which shows up as a signal below).
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
    test: "host_fs",
    ok: true,
    versions: {
      node: process.version,
      "@modelcontextprotocol/sdk": installedVersion("@modelcontextprotocol/sdk"),
      "@modelcontextprotocol/server-filesystem": installedVersion("@modelcontextprotocol/server-filesystem"),
    },
    server,
    readTool,
    initial,
    added,
    removed,
    outsideError,
    hostMessages: inbound.length,
    proxyExit: proxy.state,
  }),
);
process.exit(0);
