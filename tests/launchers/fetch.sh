#!/usr/bin/env bash
# Saves the tarball of every package in tests/launchers/npm/package-lock.json into
# tests/launchers/tarballs/ (NAME-VERSION.tgz, a scope's `@` dropped and its `/` made `-`, as
# `npm pack` names them), for the tests' loopback npm registry (tests/common/registry.rs):
# tests may use no network but loopback, yet `npx -y PKG` with a cold cache must fetch from a
# registry, so the tests serve these real, pinned tarballs themselves.
#
# Idempotent: every tarball already there is checked against the lock's `integrity` and kept;
# only missing (or corrupt) ones are fetched, all in one `npm pack` (fast once `npm ci --prefix
# tests/launchers/npm` has warmed npm's cache), checked too, and then moved in. Tarballs the
# lock no longer names are removed, so the registry serves exactly the lock's tree. Exits
# non-zero, saying why, if any tarball cannot be had or does not match the lock.
#
# Needs Node.js and npm (`$NPM` names npm if it is not on the PATH), and the npm registry
# for the tarballs that are missing. .ci/run runs it; so do the tests, once, under
# tests/launchers/.fetch.lock, when a tarball is missing (registry::require_tarballs).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec node - "$here/npm/package-lock.json" "$here/tarballs" "${NPM:-npm}" <<'JS'
const fs = require("fs");
const path = require("path");
const crypto = require("crypto");
const { spawnSync } = require("child_process");
const [lockPath, dest, npm] = process.argv.slice(2);
process.on("uncaughtException", (e) => {
  console.error(`fetch.sh: ${e.message}`);
  process.exit(1);
});

// name@version of every package the lock installs from the registry (a nested duplicate once).
const wanted = new Map();
for (const [key, entry] of Object.entries(JSON.parse(fs.readFileSync(lockPath, "utf8")).packages)) {
  if (!key.includes("node_modules/") || entry.link || entry.inBundle) continue;
  if (!entry.version || !entry.integrity) throw new Error(`${key}: no version or integrity in the lock`);
  const name = entry.name || key.slice(key.lastIndexOf("node_modules/") + "node_modules/".length);
  const file = `${name.replace(/^@/, "").replace("/", "-")}-${entry.version}.tgz`;
  wanted.set(file, { spec: `${name}@${entry.version}`, integrity: entry.integrity });
}

// Whether FILE's bytes match one of the lock's integrity hashes (`sha512-BASE64`, ...).
function matches(file, integrity) {
  const bytes = fs.readFileSync(file);
  return integrity.split(/\s+/).some((sri) => {
    const dash = sri.indexOf("-");
    const algo = sri.slice(0, dash);
    return crypto.getHashes().includes(algo)
      && crypto.createHash(algo).update(bytes).digest("base64") === sri.slice(dash + 1);
  });
}

fs.mkdirSync(dest, { recursive: true });
let removed = 0;
for (const file of fs.readdirSync(dest)) {
  const full = path.join(dest, file);
  if (file.startsWith(".partial-")) {
    fs.rmSync(full, { recursive: true, force: true });
  } else if (file.endsWith(".tgz") && (!wanted.has(file) || !matches(full, wanted.get(file).integrity))) {
    fs.rmSync(full);
    removed++;
  }
}
const missing = [...wanted.keys()].filter((file) => !fs.existsSync(path.join(dest, file)));
if (missing.length > 0) {
  const partial = fs.mkdtempSync(path.join(dest, ".partial-"));
  try {
    const run = spawnSync(
      npm,
      ["pack", "--json", "--prefer-offline", "--no-audit", "--no-fund", "--pack-destination", partial,
        ...missing.map((file) => wanted.get(file).spec)],
      { cwd: partial, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"], maxBuffer: 64 << 20 },
    );
    if (run.error) throw new Error(`cannot run \`${npm} pack\`: ${run.error.message} (install npm, or set NPM)`);
    if (run.status !== 0) throw new Error(`\`${npm} pack\` of ${missing.length} packages failed (exit ${run.status})`);
    const packed = new Map(JSON.parse(run.stdout).map((p) => [`${p.name}@${p.version}`, p.filename]));
    for (const file of missing) {
      const { spec, integrity } = wanted.get(file);
      const got = packed.get(spec);
      if (!got) throw new Error(`\`npm pack\` did not save ${spec}`);
      const from = path.join(partial, path.basename(got));
      if (!matches(from, integrity)) throw new Error(`${spec}: the tarball does not match the lock's integrity ${integrity}`);
      fs.renameSync(from, path.join(dest, file));
    }
  } finally {
    fs.rmSync(partial, { recursive: true, force: true });
  }
}
console.log(`fetch.sh: ${wanted.size} tarballs in ${dest} match the lock (${missing.length} fetched, ${removed} removed)`);
JS
