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
before it followed anything: only with `--kept`.

With `$BROWSER_FLOOD` set to N, a local process's flood comes first: N connections to the
URL's `redirect_uri` (the proxy's loopback listener) that send nothing and are opened again
as soon as the listener closes them, held while the browser follows the URL. The record then
has `"reopened"`: how many times the listener closed one of them. Python 3.11 standard library
only.
"""
import argparse
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
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


def flood(url, n):
    """Starts n threads that each hold an idle connection to url's redirect_uri, reopened
    whenever it closes; returns (stop, how many were reopened so far)."""
    redirect = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["redirect_uri"][0]
    target = urllib.parse.urlsplit(redirect)
    stop = threading.Event()
    reopened = [0]
    lock = threading.Lock()

    def hold():
        first = True
        while not stop.is_set():
            try:
                with socket.create_connection((target.hostname, target.port), timeout=1) as s:
                    if not first:
                        with lock:
                            reopened[0] += 1
                    first = False
                    s.settimeout(0.2)
                    while not stop.is_set():
                        try:
                            if not s.recv(1):
                                break  # closed by the listener
                        except socket.timeout:
                            continue
            except OSError:
                time.sleep(0.01)

    for _ in range(n):
        threading.Thread(target=hold, daemon=True).start()
    time.sleep(0.5)  # every connection open (or refused) before the person's
    return stop, reopened


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", default=os.environ.get("BROWSER_LOG"))
    parser.add_argument("--kept")
    parser.add_argument("url")
    opts = parser.parse_args()
    record = {"opened": opts.url, "seen": [opts.url]}
    if opts.kept:
        record["kept"] = snapshot(opts.kept)
    flooding = int(os.environ.get("BROWSER_FLOOD") or 0)
    if flooding:
        stop, reopened = flood(opts.url, flooding)

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
    if flooding:
        stop.set()
        record["reopened"] = reopened[0]
    if opts.log:
        with open(opts.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
