#!/usr/bin/env python3
"""files/read throughput against chunk size, for fsbroker and OpenSSH's sftp-server.

For every chunk size this runs

    fsbroker bench --json --only read --compare-sftp --file FILE --chunk-size C

--repeat times and takes the median of each figure. That gives fsbroker's read MB/s at chunk
size C and `sftp get` at sftp's own fixed setting (the bench does not pass -B, so OpenSSH picks
its request size itself: with sftp-server's limits@openssh.com extension that is 261120 bytes,
64 requests in flight) -- drawn as a horizontal reference line.

sftp's request size does not follow --chunk-size, so the script also times sftp itself at a
matching buffer size in the same repeat:

    sftp -q -B min(C, 261120) -R 64 -D /usr/lib/openssh/sftp-server -b -   <<< 'get FILE /dev/null'

sftp-server never answers a read with more than 261120 bytes (SFTP_MAX_READ_LENGTH, 256 KiB
minus 1 KiB; it says so in its limits@openssh.com reply); a larger -B only makes the client
re-request the short blocks and then shrink its requests to 261120 anyway, so -B is clamped to
261120 and the plot says so.

The file is read from the page cache (it is made, or read once, before the first run). MB/s
are 10^6 bytes of file content per second, as in the bench's own report.

Outputs: a plain-text table on stdout, the raw numbers as JSON (--json) and an SVG plot
(--out), written by hand (no plotting library). Progress goes to stderr.

Example (from the crate's root):

    cargo build --release
    python3 benches/chunk_sweep.py                      # 1 GiB file, 3 runs per point
    python3 benches/chunk_sweep.py --size 256MiB --repeat 1 --sizes 1MiB,8MiB

The binary is copied into the sweep's temp directory first, so a rebuild of
target/release/fsbroker during the sweep does not change what is measured.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import html
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_SIZES = ["64KiB", "256KiB", "1MiB", "2MiB", "4MiB", "8MiB", "16MiB"]

# sftp-server's cap on one read reply (OpenSSH SFTP_MAX_READ_LENGTH = 256 KiB - 1 KiB).
SFTP_MAX_READ = 261120
# sftp's default number of requests in flight; passed explicitly so it is on record.
SFTP_REQUESTS = 64
SFTP_SERVERS = [
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/sftp-server",
    "/usr/libexec/openssh/sftp-server",
]

UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r} (bytes, or with KiB, MiB, GiB, kB, MB, GB)"
        )
    value = int(m.group(1)) * UNITS[m.group(2).lower()]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must be above 0")
    return value


def parse_sizes(text: str) -> list[int]:
    sizes = sorted({parse_size(part) for part in text.split(",") if part.strip()})
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes given")
    return sizes


def human(n: int) -> str:
    """1048576 -> '1MiB' (exact binary units only, else bytes)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def short(n: int) -> str:
    """Axis label: 65536 -> '64K', 1048576 -> '1M'."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def nproc() -> int:
    try:
        return int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    except (OSError, ValueError, subprocess.CalledProcessError):
        return os.cpu_count() or 0


def loadavg() -> str | None:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def make_file(path: Path, size: int) -> None:
    block = 8 << 20
    written = 0
    started = time.perf_counter()
    with open(path, "wb") as f:
        while written < size:
            n = min(block, size - written)
            f.write(os.urandom(n))
            written += n
    log(f"made {path} ({human(size)} of random bytes) in {time.perf_counter() - started:.1f}s")


def warm(path: Path) -> None:
    """Reads the file once so every run finds it in the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass


def sftp_quote(path: Path) -> str:
    out = ['"']
    for c in str(path):
        if c in '"\\*?[]':
            out.append("\\")
        out.append(c)
    out.append('"')
    return "".join(out)


def find_sftp() -> tuple[str, str] | None:
    client = shutil.which("sftp")
    server = next((s for s in SFTP_SERVERS if os.access(s, os.X_OK)), None)
    return (client, server) if client and server else None


def sftp_get(client: str, server: str, path: Path, size: int, buffer: int) -> float:
    """`sftp -B buffer -R 64 -D server` getting path to /dev/null; MB/s (spawn to exit, like
    the bench's own sftp timing)."""
    cmd = [client, "-q", "-B", str(buffer), "-R", str(SFTP_REQUESTS), "-D", server, "-b", "-"]
    started = time.perf_counter()
    done = subprocess.run(
        cmd,
        input=f"get {sftp_quote(path)} /dev/null\n".encode(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.decode(errors='replace').strip()}"
        )
    return size / elapsed / 1e6


def bench(binary: Path, path: Path, chunk: int) -> dict:
    cmd = [
        str(binary), "bench", "--json", "--only", "read", "--compare-sftp",
        "--file", str(path), "--chunk-size", str(chunk),
    ]
    done = subprocess.run(cmd, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr.decode(errors='replace')[-2000:]}"
        )
    return json.loads(done.stdout)


# ---------------------------------------------------------------------------------------- SVG


def nice_step(span: float, ticks: int = 6) -> float:
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def svg_plot(result: dict) -> str:
    points = result["points"]
    W, H = 980, 540
    left, right, top, bottom = 80, 330, 78, 70
    pw, ph = W - left - right, H - top - bottom

    xs = [p["chunk_size"] for p in points]
    lx0, lx1 = math.log2(min(xs)), math.log2(max(xs))
    if lx1 - lx0 < 1:
        lx0, lx1 = lx0 - 0.5, lx1 + 0.5
    pad = 0.25
    lx0, lx1 = lx0 - pad, lx1 + pad

    values = []
    for p in points:
        for key in ("fsbroker", "sftp_default", "sftp_matched"):
            s = p.get(key)
            if s:
                values.append(s["max"])
    ymax = max(values) if values else 1.0
    step = nice_step(ymax * 1.08)
    ytop = step * math.ceil(ymax * 1.08 / step)

    def X(v: float) -> float:
        return left + (math.log2(v) - lx0) / (lx1 - lx0) * pw

    def Y(v: float) -> float:
        return top + ph - v / ytop * ph

    e = html.escape
    out = []
    add = out.append
    add(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">')
    add(f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>')
    m = result["machine"]
    add(f'<text x="{W / 2}" y="28" text-anchor="middle" font-size="19" font-weight="bold">'
        f'files/read throughput vs chunk size</text>')
    sub = (f'{m["nproc"]} CPUs ({m["cpu_model"]}), {m["date"]}, load {m.get("loadavg_before") or "?"}; '
           f'{human(result["file"]["size"])} file from page cache, base64, depth '
           f'{result["settings"].get("depth", "?")}; median of {result["repeat"]} '
           f'(whiskers: min-max)')
    add(f'<text x="{W / 2}" y="50" text-anchor="middle" font-size="12" fill="#444">{e(sub)}</text>')

    # grid and y ticks
    v = 0.0
    while v <= ytop + 1e-9:
        y = Y(v)
        add(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        add(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end" font-size="12">{v:g}</text>')
        v += step
    # x ticks: every power of two in range, labelled at the measured sizes
    lo, hi = math.ceil(lx0), math.floor(lx1)
    for k in range(lo, hi + 1):
        x = X(2**k)
        measured = 2**k in xs
        add(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + (6 if measured else 3)}" stroke="black"/>')
        if measured:
            add(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#f0f0f0"/>')
            add(f'<text x="{x:.1f}" y="{top + ph + 20}" text-anchor="middle" font-size="12">{short(2**k)}</text>')
    for c in xs:  # sizes that are not powers of two
        if c & (c - 1):
            x = X(c)
            add(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 6}" stroke="black"/>')
            add(f'<text x="{x:.1f}" y="{top + ph + 20}" text-anchor="middle" font-size="12">{short(c)}</text>')
    add(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    add(f'<text x="{left + pw / 2}" y="{H - 22}" text-anchor="middle" font-size="13">'
        f'chunk size (bytes per files/read request; sftp: -B, log2 scale)</text>')
    add(f'<text transform="translate(22 {top + ph / 2}) rotate(-90)" text-anchor="middle" '
        f'font-size="13">MB/s (10^6 bytes of file per second)</text>')

    legend = []
    # sftp at its own fixed setting: a horizontal reference line at the median over all runs
    ref = result.get("sftp_default_overall")
    if ref:
        y = Y(ref["median"])
        add(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#888" '
            f'stroke-width="2" stroke-dasharray="2 4"/>')
        legend.append(("ref", "#888", None,
                       ["sftp get at its fixed setting (the bench's",
                        f"own run: no -B, so {SFTP_MAX_READ} B, -R {SFTP_REQUESTS}),",
                        f"median of all runs: {ref['median']:.0f} MB/s"]))

    def series(key: str, color: str, marker: str, dash: str | None, label: list[str],
               dodge: float) -> None:
        pts = [(p["chunk_size"], p[key]) for p in points if p.get(key)]
        if not pts:
            return
        d = " ".join(f"{'M' if i == 0 else 'L'}{X(c):.1f},{Y(s['median']):.1f}"
                     for i, (c, s) in enumerate(pts))
        add(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2"'
            + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        for c, s in pts:
            x = X(c) + dodge  # whiskers side by side, not on top of each other
            if s["max"] > s["min"]:
                add(f'<line x1="{x:.1f}" y1="{Y(s["min"]):.1f}" x2="{x:.1f}" y2="{Y(s["max"]):.1f}" '
                    f'stroke="{color}" stroke-width="1"/>')
                for bound in (s["min"], s["max"]):
                    add(f'<line x1="{x - 4:.1f}" y1="{Y(bound):.1f}" x2="{x + 4:.1f}" y2="{Y(bound):.1f}" '
                        f'stroke="{color}" stroke-width="1"/>')
            add(draw_marker(marker, X(c), Y(s["median"]), color))
            add(f'<title>{e(human(c))}: {s["median"]:.0f} MB/s</title>')
        legend.append((marker, color, dash, label))

    series("fsbroker", "#d62728", "circle", None, ["fsbroker files/read", "(chunk size = --chunk-size)"], -3)
    series("sftp_matched", "#1f77b4", "square", "7 4",
           ["sftp get, -B = chunk size, -R 64",
            f"(-B clamped to {SFTP_MAX_READ} B, sftp-server's",
            "largest read: from 256K up all points", "are the same setting)"], 3)

    # legend box on the right
    lx, ly = left + pw + 18, top + 6
    for marker, color, dash, lines in legend:
        if marker == "ref":
            add(f'<line x1="{lx}" y1="{ly + 6}" x2="{lx + 30}" y2="{ly + 6}" stroke="{color}" '
                f'stroke-width="2" stroke-dasharray="2 4"/>')
        else:
            add(f'<line x1="{lx}" y1="{ly + 6}" x2="{lx + 30}" y2="{ly + 6}" stroke="{color}" stroke-width="2"'
                + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
            add(draw_marker(marker, lx + 15, ly + 6, color))
        for i, line in enumerate(lines):
            add(f'<text x="{lx + 38}" y="{ly + 10 + i * 15}" font-size="12">{e(line)}</text>')
        ly += 15 * len(lines) + 16
    add("</svg>")
    return "\n".join(out) + "\n"


def draw_marker(kind: str, x: float, y: float, color: str) -> str:
    if kind == "square":
        return (f'<rect x="{x - 4.5:.1f}" y="{y - 4.5:.1f}" width="9" height="9" fill="{color}" '
                f'stroke="white" stroke-width="1"/>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{color}" stroke="white" stroke-width="1"/>'


# --------------------------------------------------------------------------------------- main


def summary(values: list[float]) -> dict | None:
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description="Sweep fsbroker bench's files/read throughput over chunk sizes, with sftp-server "
        "for comparison; writes an SVG plot, a JSON file and a table.",
    )
    ap.add_argument("--fsbroker", type=Path, default=ROOT / "target/release/fsbroker",
                    help="fsbroker binary (copied to the temp dir first) [default: target/release/fsbroker]")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--file", type=Path, help="read this file (left as it is) instead of making one")
    src.add_argument("--size", type=parse_size, default=1 << 30,
                     help="size of the random file to make [default: 1GiB]")
    ap.add_argument("--repeat", type=int, default=3, help="runs per chunk size; the median is plotted [default: 3]")
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes(",".join(DEFAULT_SIZES)),
                    help=f"comma-separated chunk sizes [default: {','.join(DEFAULT_SIZES)}]")
    ap.add_argument("--out", type=Path, default=ROOT / "docs/chunk-sweep.svg",
                    help="SVG plot to write [default: docs/chunk-sweep.svg]")
    ap.add_argument("--json", type=Path, default=ROOT / "docs/chunk-sweep.json",
                    help="raw numbers to write [default: docs/chunk-sweep.json]")
    ap.add_argument("--plot-only", action="store_true",
                    help="measure nothing: redraw --out from the numbers in --json")
    args = ap.parse_args()
    if args.plot_only:
        args.out.write_text(svg_plot(json.loads(args.json.read_text())))
        log(f"wrote {args.out} from {args.json}")
        return 0
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if not args.fsbroker.is_file():
        ap.error(f"{args.fsbroker} not found (cargo build --release, or --fsbroker PATH)")
    if max(args.sizes) > 16 << 20:
        ap.error("fsbroker bench takes chunk sizes up to 16MiB")
    tool = find_sftp()
    if tool is None:
        log("warning: sftp or sftp-server not found; only fsbroker is measured")

    with tempfile.TemporaryDirectory(prefix="fsbroker-sweep-") as tmp:
        tmp = Path(tmp)
        binary = tmp / "fsbroker"
        shutil.copy2(args.fsbroker, binary)
        binary_sha = sha256(binary)
        log(f"using a copy of {args.fsbroker} (sha256 {binary_sha[:16]}…)")
        if args.file:
            path = args.file.resolve()
            size = path.stat().st_size
            generated = False
        else:
            path = tmp / "sweep.bin"
            size = args.size
            make_file(path, size)
            generated = True
        warm(path)
        load_before = loadavg()

        runs: dict[int, list[dict]] = {c: [] for c in args.sizes}
        total = len(args.sizes) * args.repeat
        n = 0
        settings = {}
        started = time.perf_counter()
        # Repeats on the outside, so slow drift of the machine spreads over all sizes instead
        # of landing on one.
        for r in range(args.repeat):
            for chunk in args.sizes:
                n += 1
                report = bench(binary, path, chunk)
                settings = report.get("settings", settings)
                # One chunk size per bench run: its only transfers entry.
                transfer = report["transfers"][0]
                run = {"fsbroker_mb_s": transfer["read"]["mb_per_s"],
                       "fsbroker_seconds": transfer["read"]["seconds"],
                       "fsbroker_requests": transfer["read"].get("requests"),
                       "broker_peak_bytes": report.get("memory", {}).get("peak_bytes")}
                if transfer.get("sftp_get"):
                    run["sftp_default_mb_s"] = transfer["sftp_get"]["mb_per_s"]
                if tool:
                    buffer = min(chunk, SFTP_MAX_READ)
                    run["sftp_buffer"] = buffer
                    run["sftp_matched_mb_s"] = sftp_get(*tool, path, size, buffer)
                runs[chunk].append(run)
                msg = (f"[{n}/{total}] {human(chunk):>6} run {r + 1}/{args.repeat}: "
                       f"fsbroker {run['fsbroker_mb_s']:7.0f} MB/s")
                if "sftp_default_mb_s" in run:
                    msg += f", sftp (bench) {run['sftp_default_mb_s']:7.0f}"
                if "sftp_matched_mb_s" in run:
                    msg += f", sftp -B {run['sftp_buffer']} {run['sftp_matched_mb_s']:7.0f}"
                log(msg)
        load_after = loadavg()
        log(f"sweep took {time.perf_counter() - started:.0f}s (load average before {load_before}, "
            f"after {load_after})")

    points = []
    for chunk in args.sizes:
        rs = runs[chunk]
        p = {
            "chunk_size": chunk,
            "chunk": human(chunk),
            "fsbroker": summary([x["fsbroker_mb_s"] for x in rs]),
            "sftp_default": summary([x["sftp_default_mb_s"] for x in rs if "sftp_default_mb_s" in x]),
            "sftp_matched": summary([x["sftp_matched_mb_s"] for x in rs if "sftp_matched_mb_s" in x]),
            "sftp_buffer": rs[0].get("sftp_buffer"),
            "broker_peak_bytes": max((x["broker_peak_bytes"] or 0) for x in rs) or None,
            "runs": rs,
        }
        if p["fsbroker"] and p["sftp_matched"]:
            p["ratio_vs_matched"] = p["fsbroker"]["median"] / p["sftp_matched"]["median"]
        if p["fsbroker"] and p["sftp_default"]:
            p["ratio_vs_default"] = p["fsbroker"]["median"] / p["sftp_default"]["median"]
        points.append(p)

    all_default = [x["sftp_default_mb_s"] for c in args.sizes for x in runs[c] if "sftp_default_mb_s" in x]
    result = {
        "tool": "benches/chunk_sweep.py",
        "machine": {
            "nproc": nproc(),
            "cpu_model": cpu_model(),
            "kernel": platform.release(),
            "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
        "fsbroker": {"binary": str(args.fsbroker), "sha256": binary_sha},
        "file": {"path": None if generated else str(path), "size": size, "generated": generated},
        "settings": settings,
        "repeat": args.repeat,
        "sftp": None if tool is None else {
            "client": tool[0], "server": tool[1], "requests": SFTP_REQUESTS,
            "max_read": SFTP_MAX_READ,
            "note": "sftp_default: the bench's own sftp get (no -B: OpenSSH uses sftp-server's "
                    "limit, 261120 B, -R 64); sftp_matched: this script's sftp get with "
                    "-B min(chunk, 261120) -R 64",
        },
        "units": "MB/s = 10^6 bytes of file content per second",
        "sftp_default_overall": summary(all_default),
        "points": points,
    }

    # table
    print(f"files/read throughput vs chunk size ({human(size)} file, median of {args.repeat}; "
          f"{result['machine']['nproc']} CPUs, {result['machine']['cpu_model']})")
    print(f"{'chunk':>7} {'fsbroker':>10} {'sftp(bench)':>12} {'-B bytes':>9} {'sftp -B':>10} "
          f"{'fsb/sftp-B':>10} {'fsb/sftp':>9} {'peak RSS':>9}")
    print(f"{'':>7} {'MB/s':>10} {'MB/s':>12} {'bytes':>9} {'MB/s':>10} {'':>10} {'(bench)':>9} {'MiB':>9}")
    for p in points:
        def cell(s, w):
            return f"{s['median']:{w}.0f}" if s else f"{'-':>{w}}"
        ratio_m = f"{p['ratio_vs_matched']:10.2f}" if "ratio_vs_matched" in p else f"{'-':>10}"
        ratio_d = f"{p['ratio_vs_default']:9.2f}" if "ratio_vs_default" in p else f"{'-':>9}"
        peak = f"{p['broker_peak_bytes'] / (1 << 20):9.0f}" if p["broker_peak_bytes"] else f"{'-':>9}"
        print(f"{p['chunk']:>7} {cell(p['fsbroker'], 10)} {cell(p['sftp_default'], 12)} "
              f"{p['sftp_buffer'] or '-':>9} {cell(p['sftp_matched'], 10)} {ratio_m} {ratio_d} {peak}")
    if all_default:
        s = result["sftp_default_overall"]
        print(f"sftp at its fixed setting (bench, all {len(all_default)} runs): median {s['median']:.0f} "
              f"MB/s, min {s['min']:.0f}, max {s['max']:.0f}")

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(svg_plot(result))
    log(f"wrote {args.out} and {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
