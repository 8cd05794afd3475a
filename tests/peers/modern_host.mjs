// A host made with the TypeScript SDK v2, speaking MCP 2026-07-28 (`versionNegotiation: auto`,
// as hosts that moved on do), with roots of its own, runs a modern server under
// `fsbroker proxy --policy P`. Checks that the server sees the broker's roots and never the
// host's (the host's roots handler is never called), that a policy reload changes the next
// answer, that a confirmation asked together with roots reaches the host alone, and (TS
// server) that a 50 MiB file read through `files/read` chunks arrives whole, in 1 MiB chunks
// and in the largest the default policy allows.
//
// Env: FSBROKER_BIN, PEERS_TMPDIR (from tests/common/peers.rs), MODERN_SERVER = ts | py,
// PEERS_PYTHON (the venv's python, for the py server).
import { createHash } from 'node:crypto';
import { mkdirSync, renameSync, writeFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const fail = (what) => {
  process.stderr.write(`PEER TEST FAILED: ${what}\n`);
  process.exit(1);
};
setTimeout(() => fail('watchdog: 100 s'), 100_000).unref();

const tmp = process.env.PEERS_TMPDIR;
const rootA = join(tmp, 'alpha');
const rootB = join(tmp, 'beta');
mkdirSync(rootA, { recursive: true });
mkdirSync(rootB, { recursive: true });
const policy = join(tmp, 'policy.toml');
const writePolicy = (dir, name) => {
  writeFileSync(`${policy}.new`, `[[root]]\npath = '${dir}'\nname = "${name}"\nmode = "read-write"\nconsent = "auto"\n`);
  renameSync(`${policy}.new`, policy);
};
writePolicy(rootA, 'alpha');

const which = process.env.MODERN_SERVER ?? 'ts';
const server = which === 'py'
  ? [process.env.PEERS_PYTHON, 'modern_server.py']
  : [process.execPath, 'modern_server.mjs'];

let hostRootsCalls = 0;
let elicitations = 0;
const client = new Client(
  { name: 'modern-ts-host', version: '1.0.0' },
  { capabilities: { roots: { listChanged: true }, elicitation: { form: {} } }, versionNegotiation: { mode: 'auto' } },
);
client.setRequestHandler('roots/list', async () => {
  hostRootsCalls += 1;
  return { roots: [{ uri: 'file:///host-only-root', name: 'host' }] };
});
client.setRequestHandler('elicitation/create', async () => {
  elicitations += 1;
  return { action: 'accept', content: { confirm: true } };
});
await client.connect(new StdioClientTransport({
  command: process.env.FSBROKER_BIN,
  args: ['proxy', '--policy', policy, '--', ...server],
  stderr: 'inherit',
}));
const version = client.getNegotiatedProtocolVersion?.();
if (version !== '2026-07-28') fail(`negotiated ${version}, not 2026-07-28`);

const call = async (name, args = {}) => {
  const res = await client.callTool({ name, arguments: args });
  if (res.isError) fail(`${name}: ${JSON.stringify(res.content)}`);
  return JSON.parse(res.content[0].text);
};
const uri = (dir) => pathToFileURL(dir).href;

const first = await call('show_roots');
if (JSON.stringify(first.roots) !== JSON.stringify([uri(rootA)])) fail(`show_roots: ${JSON.stringify(first)}`);

writePolicy(rootB, 'beta');
let after;
for (let i = 0; i < 100; i++) {
  after = await call('show_roots');
  if (JSON.stringify(after.roots) === JSON.stringify([uri(rootB)])) break;
  await new Promise((r) => setTimeout(r, 100));
}
if (JSON.stringify(after.roots) !== JSON.stringify([uri(rootB)])) fail(`after the reload: ${JSON.stringify(after)}`);

const both = await call('confirm_and_roots', { path: join(rootB, 'x.txt') });
if (JSON.stringify(both.roots) !== JSON.stringify([uri(rootB)])) fail(`confirm_and_roots roots: ${JSON.stringify(both)}`);
if (both.confirm !== true && both.confirm !== 'accept') fail(`confirm_and_roots confirm: ${JSON.stringify(both)}`);
if (elicitations !== 1) fail(`the host saw ${elicitations} elicitations, not 1`);

let big = null;
if (which === 'ts') {
  const data = Buffer.alloc(50 << 20);
  for (let i = 0; i < data.length; i += 4) data.writeUInt32LE((i * 2654435761) >>> 0, i);
  writeFileSync(join(rootB, 'big.bin'), data);
  const want = createHash('sha256').update(data).digest('hex');
  big = await call('read_file_chunks', { path: 'beta/big.bin', chunk: 1 << 20 });
  if (big.sha256 !== want || big.bytes !== data.length) fail(`read_file_chunks: ${JSON.stringify(big)}, want ${want}`);
  // The largest chunk the default policy allows (7 MiB) still fits the SDK's 10 MiB line.
  const largest = await call('read_file_chunks', { path: 'beta/big.bin', chunk: 7 << 20 });
  if (largest.sha256 !== want || largest.chunks !== 8) fail(`read_file_chunks at 7 MiB: ${JSON.stringify(largest)}`);
}
if (hostRootsCalls !== 0) fail(`the host's own roots handler was called ${hostRootsCalls} times`);
await client.close();

const versions = Object.fromEntries(['client', 'server'].map((p) => [p,
  JSON.parse(readFileSync(new URL(`./node_modules/@modelcontextprotocol/${p}/package.json`, import.meta.url))).version]));
console.log(JSON.stringify({ ok: true, test: 'modern_host', server: which, version, first, after, both, big, elicitations, hostRootsCalls, versions }));
