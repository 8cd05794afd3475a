"""Renders benches/srt_compare.sh's results as Markdown: report.py OUT "SANDBOXES".

Reads OUT/results.jsonl (one record per sandbox and form, from driver.py), OUT/cases.json
(the probe's operations) and OUT/timing.jsonl (the warm starts); prints the tables that
docs/srt-comparison.md carries: which forms started under each sandbox, which hostile
cases each blocked (in how many of the forms that started), the probe's result per form, and
the warm start times.
"""
import json
import statistics
import sys
from collections import OrderedDict

FORMS = OrderedDict([
    ("npx-cold", "`npx -y PKG`, cold (empty cache)"),
    ("npx-warm", "`npx -y PKG`, warm (second start)"),
    ("global-bin", "global install (`~/.npm-global/bin/NAME`)"),
    ("global-npx", "global install, `npx NAME`"),
    ("local-bin", "project-local install, `node_modules/.bin/NAME` from elsewhere"),
    ("local-npx", "project-local install, `npx NAME` in the project"),
    ("node-script", "`node …/probe.js`"),
    ("cargo-bin", "compiled binary in `~/.cargo/bin`"),
    ("uvx-cold", "`uvx PKG`, cold"),
    ("uvx-warm", "`uvx PKG`, warm"),
    ("pipx-run", "`pipx run PKG`"),
    ("venv-python", "a venv's python by path, `-m MODULE`"),
    ("ref-npx-cold", "reference filesystem server, `npx -y` from registry.npmjs.org (starts only)"),
])


def blocked(result):
    return result is not None and not result.startswith("ok")


def short(result):
    if result is None:
        return "–"
    if result.startswith("ok:") and not result.startswith(("ok:direct", "ok:proxy")):
        return "ok"
    return result


def main():
    out, sandboxes = sys.argv[1], sys.argv[2].split()
    cases = json.load(open(f"{out}/cases.json"))
    records = {}
    for line in open(f"{out}/results.jsonl"):
        r = json.loads(line)
        records[(r["sandbox"], r["form"])] = r
    asked = {}
    try:
        for line in open(f"{out}/results.jsonl.registry.tsv"):
            sb, form, n = line.rstrip("\n").split("\t")
            asked[(sb, form)] = int(n)
    except FileNotFoundError:
        pass
    forms = [f for f in FORMS if any((sb, f) in records for sb in sandboxes)]
    forms += [f for (_, f) in records if f not in forms]
    p = print

    p("### Launch forms: did the server start?\n")
    p("Each cell: whether it started (the probe reported, or the server answered `initialize`), "
      "the seconds to that, and how many requests the test registry or index answered meanwhile "
      "(a cold start asks; the reference server's come from registry.npmjs.org).\n")
    p("| form | " + " | ".join(sandboxes) + " |")
    p("|---|" + "---|" * len(sandboxes))
    started = {sb: 0 for sb in sandboxes}
    probe_forms = {sb: 0 for sb in sandboxes}
    for f in forms:
        cells = []
        for sb in sandboxes:
            r = records.get((sb, f))
            if r is None:
                cells.append("not run")
                continue
            if r["started"]:
                started[sb] += 1
                t = r["t_init"] if r["t_init"] is not None else r["t_probe"]
                n = asked.get((sb, f))
                reqs = "" if n is None or f == "ref-npx-cold" else f", {n} test-registry requests"
                cells.append(f"yes ({t:.1f} s{reqs})" if t is not None else "yes")
            else:
                why = "timed out" if r["timed_out"] else f"exit {r['rc']}"
                if r.get("error"):
                    msg = (r["error"].get("message") or "").splitlines()[0] if r["error"].get("message") else ""
                    why = "error: " + msg.removeprefix("internal error: ").removeprefix("fsbroker: ")[:90].replace("|", "/")
                cells.append(f"**no** ({why})")
        p(f"| {FORMS.get(f, f)} | " + " | ".join(cells) + " |")
    p("| **forms started** | " + " | ".join(f"**{started[sb]} of {len(forms)}**" for sb in sandboxes) + " |")
    p()

    probe_records = {sb: [records[(sb, f)] for f in forms
                          if (sb, f) in records and records[(sb, f)]["started"] and records[(sb, f)]["results"]]
                     for sb in sandboxes}
    p("### Hostile cases: blocked in how many of the forms that started\n")
    p("Each cell: in how many of the probe's forms that started under that sandbox the case was "
      "blocked (the first two rows: worked), and the result seen.\n")
    p("| case | " + " | ".join(sandboxes) + " |")
    p("|---|" + "---|" * len(sandboxes))
    blocked_all = {sb: 0 for sb in sandboxes}
    hostile = 0
    for i, (cid, what, _, _) in enumerate(cases):
        is_root = cid.startswith("root-")
        hostile += 0 if is_root else 1
        cells = []
        for sb in sandboxes:
            rs = [r["results"][i] for r in probe_records[sb] if i < len(r["results"])]
            if not rs:
                cells.append("–")
                continue
            n = sum((not blocked(x)) if is_root else blocked(x) for x in rs)
            seen = sorted({short(x) for x in rs})
            if not is_root and n == len(rs):
                blocked_all[sb] += 1
            codes = ", ".join(f"`{s}`" for s in seen)
            if is_root:
                cell = f"works {n}/{len(rs)}: {codes}"
            elif n == len(rs):
                cell = f"blocked {n}/{len(rs)}: {codes}"
            else:
                cell = f"**open in {len(rs) - n}/{len(rs)}**: {codes}"
            cells.append(cell)
        p(f"| {what} | " + " | ".join(cells) + " |")
    p("| **hostile cases blocked in every form that started** | "
      + " | ".join(f"**{blocked_all[sb]} of {hostile}**" for sb in sandboxes) + " |")
    p()

    p("### The probe's results, form by form\n")
    p("B: blocked; **open**: the operation succeeded; ok: the root worked; –: the form did not start.\n")
    ids = [c[0] for c in cases]
    p("| sandbox | form | " + " | ".join(ids) + " |")
    p("|---|---|" + "---|" * len(ids))
    for sb in sandboxes:
        for f in forms:
            r = records.get((sb, f))
            if r is None or r["kind"] == "server":
                continue
            res = r["results"] or []
            cells = []
            for i, cid in enumerate(ids):
                x = res[i] if i < len(res) else None
                if x is None:
                    cells.append("–")
                elif cid.startswith("root-"):
                    cells.append("ok" if not blocked(x) else f"**fails** `{x}`")
                else:
                    cells.append(f"B `{x[4:]}`" if blocked(x) else f"**open** `{short(x)}`")
            p(f"| {sb} | {f} | " + " | ".join(cells) + " |")
    p()

    timing = [json.loads(l) for l in open(f"{out}/timing.jsonl")] if open(f"{out}/timing.jsonl").read() else []
    if timing:
        p("### Warm start: `npx -y fsbroker-launch-probe`, package already fetched\n")
        p("Seconds from starting the command to the answer to `initialize`.\n")
        p("| sandbox | runs | median | min | max |")
        p("|---|---|---|---|---|")
        for sb in sandboxes:
            # Only starts that answered: a refusal (nothing fetched yet) answers at once.
            ts = [r["t_init"] for r in timing if r["sandbox"] == sb and r["started"] and r["answered"]]
            if ts:
                p(f"| {sb} | {len(ts)} | {statistics.median(ts):.2f} | {min(ts):.2f} | {max(ts):.2f} |")
            else:
                p(f"| {sb} | 0 | – | – | – |")
        p()


if __name__ == "__main__":
    main()
