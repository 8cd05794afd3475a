#!/usr/bin/env python3
"""Start-up cost of --confine for the launch line people use most: `npx -y PKG`, warm.

Times, in back-to-back pairs, how long the host waits for the answer to `initialize`:
- unconfined: `npx -y SPEC ROOT` (npx resolves the package in its cache, asks nothing of the
  registry for an exact version, and starts the server);
- confined: `fsbroker proxy --root ROOT --confine -- npx -y SPEC` (fsbroker resolves the same
  package, plans and builds the sandbox, and starts the server's program directly).
Both are warm: one start of each is made, and thrown away, before the pairs. Prints each pair,
the medians and the ratio confined / unconfined (the goal: at most 1.5). Beside them, the
program the confined start runs (the one npx would have run), started unconfined by its path:
what the sandbox itself costs, without npx's own start.

Usage: benches/confine_start.py [--fsbroker PATH] [--runs N] [--spec PKG@VERSION]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": "bench", "version": "1"}}}) + "\n"


def time_to_answer(argv):
    """Seconds from the start of `argv` to its first stdout line (the initialize answer)."""
    start = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    p.stdin.write(INIT)
    p.stdin.flush()
    line = p.stdout.readline()
    elapsed = time.perf_counter() - start
    p.stdin.close()
    p.wait(timeout=30)
    if '"result"' not in line:
        sys.exit(f"no initialize answer from {argv}: {line!r}")
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fsbroker", default="target/release/fsbroker")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--spec", default="@modelcontextprotocol/server-filesystem@2026.8.31")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="confine-start-")
    unconfined = ["npx", "-y", args.spec, root]
    confined = [args.fsbroker, "proxy", "--root", root, "--confine", "--confine-fetch", "npm",
                "--", "npx", "-y", args.spec]
    # Warm both: npx's cache and fsbroker's (the first confined start may install).
    time_to_answer(unconfined)
    time_to_answer(confined)
    # The program the confined start runs, from the proxy's own report of it.
    report = subprocess.run(confined, input=INIT, capture_output=True, text=True,
                            env={**os.environ, "RUST_LOG": "fsbroker=info"}).stderr
    program = next((w for line in report.splitlines() if "'s program " in line
                    for w in [line.split("'s program ", 1)[1].split(" ", 1)[0]]), None)
    if program is None:
        sys.exit(f"the proxy did not say which program it runs:\n{report}")
    direct = [program, root]
    rows = []
    for i in range(args.runs):
        u, c, d = time_to_answer(unconfined), time_to_answer(confined), time_to_answer(direct)
        rows.append((u, c, d))
        print(f"run {i + 1:2}: npx unconfined {u * 1000:7.1f} ms   confined {c * 1000:7.1f} ms"
              f"   ratio {c / u:.2f}   (its program unconfined {d * 1000:7.1f} ms)")
    mu, mc, md = (statistics.median(r[k] for r in rows) for k in range(3))
    print(f"median: npx unconfined {mu * 1000:.1f} ms, confined {mc * 1000:.1f} ms, "
          f"confined / unconfined {mc / mu:.2f} (goal <= 1.5); the program alone unconfined "
          f"{md * 1000:.1f} ms, so the sandbox adds {(mc - md) * 1000:.1f} ms ({mc / md:.2f}x)")
    os.rmdir(root)


if __name__ == "__main__":
    main()
