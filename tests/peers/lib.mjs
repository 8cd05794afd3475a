// Shared helpers for the peer tests (run by tests/peers.rs).
//
// Inputs come from the environment the Rust test sets:
//   FSBROKER_BIN  the fsbroker binary to run as `fsbroker proxy ... -- SERVER`
//   PEERS_TMPDIR  an empty scratch directory owned by this run
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const HERE = path.dirname(fileURLToPath(import.meta.url));

/** Reads a required environment variable, or fails with a message saying who sets it. */
export function env(name) {
  const v = process.env[name];
  if (!v) fail(`${name} is not set (tests/peers.rs sets it; run the test with cargo test --test peers)`);
  return v;
}

/** Ends the run with a clear message and a non-zero status. */
export function fail(message, details) {
  process.stderr.write(`\nPEER TEST FAILED: ${message}\n`);
  if (details !== undefined) process.stderr.write(`${JSON.stringify(details, null, 2)}\n`);
  process.exit(1);
}

export function check(cond, message, details) {
  if (!cond) fail(message, details);
}

/** Fails the whole run if it takes longer than `seconds` (the scripts must stay short). */
export function watchdog(seconds, what) {
  const t = setTimeout(() => fail(`${what}: no result after ${seconds} s`), seconds * 1000);
  return () => clearTimeout(t);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Calls `probe` until its answer has `ok` set or `ms` pass; returns the last answer. */
export async function poll(ms, probe) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    last = await probe();
    if (last.ok || Date.now() > deadline) return last;
    await sleep(50);
  }
}

/** Writes `text` to a new file beside `file` and renames it over `file`, as editors do. */
export function replaceFile(file, text) {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.${process.pid}.tmp`);
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, file);
}

/** A TOML basic string. */
export const tomlString = (s) => JSON.stringify(s);

/** The installed version of an npm package of tests/peers. */
export function installedVersion(pkg) {
  // Straight from node_modules: not every package exports its package.json.
  const file = path.join(HERE, "node_modules", ...pkg.split("/"), "package.json");
  return JSON.parse(fs.readFileSync(file, "utf8")).version;
}

/** The text of a tool result's content (all text blocks joined). */
export function toolText(result) {
  return (result.content ?? [])
    .filter((c) => c.type === "text")
    .map((c) => c.text)
    .join("\n");
}

/**
 * Watches every message the host receives: `transport.onmessage` set before `connect` is
 * chained by the SDK's Protocol, so this sees each message before the Client handles it.
 */
export function recordInbound(transport) {
  const seen = [];
  transport.onmessage = (msg) => seen.push(msg);
  return seen;
}

/** Methods the broker must answer itself: they must never reach the host. */
export const brokered = (method) =>
  typeof method === "string" &&
  (method === "roots/list" ||
    method.startsWith("files/") ||
    method === "notifications/roots/list_changed" ||
    method.startsWith("notifications/files/"));

/**
 * Captures the spawned proxy's exit (the SDK keeps the child process private), so the run
 * can show that the proxy ended by itself once the host closed its stdin.
 */
export function captureExit(transport) {
  const child = transport._process;
  const state = { code: undefined, signal: undefined };
  if (!child) return { state, exited: Promise.resolve() };
  const exited = new Promise((resolve) =>
    child.once("exit", (code, signal) => {
      state.code = code;
      state.signal = signal;
      resolve();
    }),
  );
  return { state, exited };
}
