"""Builds the probe's wheel, fsbroker_launch_probe-1.0.0-py3-none-any.whl, into the directory
given as the first argument, with the standard library only (no build backend to fetch): the
package fsbroker_launch_probe (probe.py, and `python -m fsbroker_launch_probe`), its console
script `fsbroker-launch-probe`, and the metadata pip and uv read. Run by
tests/confine_launchers.rs and by benches/srt_compare.sh, which serve it from their own indexes;
it prints the wheel's path."""
import base64
import hashlib
import os
import sys
import zipfile

NAME, VERSION = "fsbroker_launch_probe", "1.0.0"
HERE = os.path.dirname(os.path.abspath(__file__))
DIST = f"{NAME}-{VERSION}.dist-info"
FILES = {
    f"{NAME}/__init__.py": open(os.path.join(HERE, "probe.py"), "rb").read(),
    f"{NAME}/__main__.py": b"from . import main\nmain()\n",
    f"{DIST}/METADATA": f"Metadata-Version: 2.1\nName: fsbroker-launch-probe\nVersion: {VERSION}\nSummary: fsbroker's hostile launch probe (tests and benches only)\n".encode(),
    f"{DIST}/WHEEL": b"Wheel-Version: 1.0\nGenerator: fsbroker-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    f"{DIST}/entry_points.txt": f"[console_scripts]\nfsbroker-launch-probe = {NAME}:main\n".encode(),
}


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


out = os.path.join(sys.argv[1], f"{NAME}-{VERSION}-py3-none-any.whl")
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    record = []
    for path, data in FILES.items():
        info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        z.writestr(info, data)
        record.append(f"{path},{digest(data)},{len(data)}")
    record.append(f"{DIST}/RECORD,,")
    z.writestr(zipfile.ZipInfo(f"{DIST}/RECORD", date_time=(2026, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
print(out)
