"""A browser for tests/sign_in_hostile.rs, given to `fsbroker proxy` as `$BROWSER`:

    python3 oauth_browser.py LOG KEPT URL

It opens URL as a person who signs in at once would: a GET, following every redirect (the
authorization server's back to fsbroker's loopback listener). It appends one JSON line to LOG:
`{"opened": URL, "seen": [every URL requested, in order], "status": the last answer's HTTP
status, or "error: ...", "kept": {name: text}}`, where `kept` is what the folder KEPT (the
proxy's sign-in cache) held when the browser was opened, before it followed anything.
Python 3.11 standard library only.
"""

import json
import os
import sys
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
    log, kept, url = sys.argv[1], sys.argv[2], sys.argv[3]
    before = snapshot(kept)
    seen = [url]

    class Follow(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            seen.append(newurl)
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    opener = urllib.request.build_opener(Follow())
    try:
        with opener.open(url, timeout=20) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except (urllib.error.URLError, OSError) as e:
        status = "error: " + str(e)
    entry = {"opened": url, "seen": seen, "status": status, "kept": before}
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


if __name__ == "__main__":
    main()
