#!/usr/bin/env python3
"""The sign-in tests' browser, given to `fsbroker proxy` as `$BROWSER`:

    browser_follow.py [--log LOG] [--kept DIR] URL

It opens URL as a person who signs in at once would: a GET, following every redirect (the
authorization server's back to the proxy's loopback listener). It appends one JSON line to LOG
(default: `$BROWSER_LOG`; none, no record), so a test can count the sign-ins that needed the
person and see where each went:
`{"opened": URL, "seen": [every URL requested, in order], "ended": the last URL,
"status": the last answer's HTTP status, "error": why nothing answered, "kept": {name: text}}`.
`kept` is what the folder DIR (the proxy's sign-in cache) held when the browser was opened,
before it followed anything: only with `--kept`. Python 3.11 standard library only.
"""
import argparse
import json
import os
import urllib.error
import urllib.request


def snapshot(folder):
    out = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                out[name] = f.read()
        except OSError as e:
            out[name] = "unreadable: " + str(e)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", default=os.environ.get("BROWSER_LOG"))
    parser.add_argument("--kept")
    parser.add_argument("url")
    opts = parser.parse_args()
    record = {"opened": opts.url, "seen": [opts.url]}
    if opts.kept:
        record["kept"] = snapshot(opts.kept)

    class Follow(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            record["seen"].append(newurl)
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    try:
        with urllib.request.build_opener(Follow()).open(opts.url, timeout=20) as r:
            record.update(status=r.status, ended=r.geturl())
    except urllib.error.HTTPError as e:
        record.update(status=e.code, ended=e.geturl())
    except Exception as e:  # the test reads why
        record.update(error=str(e))
    if opts.log:
        with open(opts.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
