// The reference filesystem server under `fsbroker proxy --confine`, driven by the official
// TypeScript SDK's Client, started with `/` as its directory argument (reaching far outside
// every root), three ways:
//
// 1. `node SERVER /` with a read-write and a read-only root: the server takes the broker's
//    roots as its allowed directories (list_allowed_directories works); writing in the
//    read-write root works; writing in the read-only root fails in the kernel (EACCES: the
//    server itself thinks it may, it does not know modes); reading outside fails.
// 2. The same through `npx mcp-server-filesystem /` run from the directory where the package
//    is installed locally (tests/peers): no configuration beyond --confine.
// 3. No root the server is told of (only a `prompt` root, which roots/list leaves out, and
//    `[confine] read`/`write` paths): the server keeps `/` as its allowed directory and tries
//    everything it is asked; the kernel alone refuses reading and listing outside, writing in
//    the read-only path and reading the unapproved prompt root, and lets it read the paths
//    it was given.
//
// Prints one JSON summary line and exits 0, or exits 1 with a message on stderr.
import fs from "node:fs";
import path from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { HERE, captureExit, check, env, installedVersion, toolText, tomlString, watchdog } from "./lib.mjs";

const stopWatchdog = watchdog(55, "host_confine");
const BIN = env("FSBROKER_BIN");
const TMP = env("PEERS_TMPDIR");
const SERVER = path.join(HERE, "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
check(fs.existsSync(SERVER), `${SERVER} is missing: run npm ci --prefix tests/peers`);

const rw = path.join(TMP, "rw");
const ro = path.join(TMP, "ro");
const asked = path.join(TMP, "asked");
const outside = path.join(TMP, "outside");
for (const d of [rw, ro, asked, outside]) fs.mkdirSync(d, { recursive: true });
fs.writeFileSync(path.join(ro, "f.txt"), "in ro\n");
fs.writeFileSync(path.join(asked, "f.txt"), "in asked\n");
fs.writeFileSync(path.join(outside, "secret.txt"), "top secret\n");

const rootsPolicy = path.join(TMP, "roots.toml");
fs.writeFileSync(
  rootsPolicy,
  `[[root]]\npath = ${tomlString(rw)}\nmode = "read-write"\nconsent = "auto"\n\n` +
    `[[root]]\npath = ${tomlString(ro)}\nconsent = "auto"\n`,
);
const pathsPolicy = path.join(TMP, "paths.toml");
fs.writeFileSync(
  pathsPolicy,
  `[[root]]\npath = ${tomlString(asked)}\nconsent = "prompt"\n\n` +
    `[confine]\nwrite = [${tomlString(rw)}]\nread = [${tomlString(ro)}]\n`,
);

async function connect(policy, server, cwd) {
  const transport = new StdioClientTransport({
    command: BIN,
    args: ["proxy", "--policy", policy, "--confine", "--", ...server],
    cwd,
    stderr: "inherit",
    env: { PATH: process.env.PATH, HOME: process.env.HOME, RUST_LOG: process.env.RUST_LOG ?? "error" },
  });
  const client = new Client({ name: "fsbroker-peer-host-confine", version: "0.0.0" }, { capabilities: {} });
  await client.connect(transport);
  return { client, proxy: captureExit(transport) };
}

async function call(client, name, args) {
  const r = await client.callTool({ name, arguments: args });
  return { isError: r.isError === true, text: toolText(r) };
}

/** Waits until the server's allowed directories are `want` (it asks for roots after start). */
async function allowedBecomes(client, want) {
  let got;
  for (let i = 0; i < 100; i++) {
    const r = await call(client, "list_allowed_directories", {});
    check(!r.isError, "list_allowed_directories failed", r);
    got = r.text.split("\n").slice(1).filter(Boolean).sort();
    if (JSON.stringify(got) === JSON.stringify(want)) return got;
    await new Promise((res) => setTimeout(res, 100));
  }
  check(false, "the server's allowed directories", { want, got });
}

async function withRoots(server, cwd, label) {
  const { client, proxy } = await connect(rootsPolicy, server, cwd);
  const allowed = await allowedBecomes(client, [rw, ro].map((d) => fs.realpathSync(d)).sort());
  const name = `${label}.txt`;
  const wrote = await call(client, "write_file", { path: path.join(rw, name), content: "hello" });
  check(!wrote.isError && fs.readFileSync(path.join(rw, name), "utf8") === "hello", `${label}: write in the read-write root`, wrote);
  const roWrite = await call(client, "write_file", { path: path.join(ro, name), content: "x" });
  check(roWrite.isError && /EACCES|permission denied/i.test(roWrite.text), `${label}: a write in the read-only root must fail in the kernel`, roWrite);
  check(!fs.existsSync(path.join(ro, name)), `${label}: nothing written in the read-only root`);
  const roRead = await call(client, "read_text_file", { path: path.join(ro, "f.txt") });
  check(!roRead.isError && roRead.text === "in ro\n", `${label}: read in the read-only root`, roRead);
  const out = await call(client, "read_text_file", { path: path.join(outside, "secret.txt") });
  check(out.isError && !out.text.includes("top secret"), `${label}: a read outside must fail`, out);
  await client.close();
  await proxy.exited;
  return { allowed, roWriteError: roWrite.text, outsideError: out.text, proxyExit: proxy.state };
}

// 1 and 2.
const direct = await withRoots([process.execPath, SERVER, "/"], TMP, "direct");
const npx = await withRoots(["npx", "mcp-server-filesystem", "/"], HERE, "npx");

// 3. The server believes it may go anywhere.
const { client, proxy } = await connect(pathsPolicy, [process.execPath, SERVER, "/"], TMP);
const allowed = await allowedBecomes(client, ["/"]);
const kernel = {};
const attempts = {
  readOutside: ["read_text_file", { path: path.join(outside, "secret.txt") }],
  listOutside: ["list_directory", { path: outside }],
  listRoot: ["list_directory", { path: "/" }],
  readPrompt: ["read_text_file", { path: path.join(asked, "f.txt") }],
  writeReadOnly: ["write_file", { path: path.join(ro, "k.txt"), content: "x" }],
};
for (const [what, [tool, args]] of Object.entries(attempts)) {
  const r = await call(client, tool, args);
  check(r.isError && /EACCES|permission denied/i.test(r.text), `no roots: ${what} must be refused by the kernel`, r);
  check(!r.text.includes("top secret") && !r.text.includes("in asked"), `no roots: ${what} leaked content`, r);
  kernel[what] = r.text;
}
const w = await call(client, "read_text_file", { path: path.join(rw, "direct.txt") });
check(!w.isError && w.text === "hello", "no roots: read in the [confine] write path", w);
const r = await call(client, "read_text_file", { path: path.join(ro, "f.txt") });
check(!r.isError && r.text === "in ro\n", "no roots: read in the [confine] read path", r);
await client.close();
await proxy.exited;

stopWatchdog();
console.log(
  JSON.stringify({
    test: "host_confine",
    ok: true,
    versions: {
      node: process.version,
      "@modelcontextprotocol/sdk": installedVersion("@modelcontextprotocol/sdk"),
      "@modelcontextprotocol/server-filesystem": installedVersion("@modelcontextprotocol/server-filesystem"),
    },
    direct,
    npx,
    noRoots: { allowed, kernel, proxyExit: proxy.state },
  }),
);
