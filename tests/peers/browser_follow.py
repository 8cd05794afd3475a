#!/usr/bin/env python3
"""A browser for sign-in tests, given as `$BROWSER`: it opens the URL it is given and follows
the redirects, as a person's browser would once they approved, so the authorization server's
redirect reaches the proxy's loopback listener. Each URL it was given, and where it ended, is
appended to the file `$BROWSER_LOG` (one JSON object per line), so a test can count the
sign-ins that needed the person."""
import json
import os
import sys
import urllib.error
import urllib.request

url = sys.argv[1]
record = {"opened": url}
try:
    with urllib.request.urlopen(url, timeout=20) as response:
        record.update(status=response.status, ended=response.geturl())
except urllib.error.HTTPError as e:
    record.update(status=e.code, ended=e.geturl())
except Exception as e:  # the test reads why
    record.update(error=str(e))
log = os.environ.get("BROWSER_LOG")
if log:
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
