#!/usr/bin/env bash
# The "cat | cat" pipe ceiling for chunked files/read, next to sftp-server in the same run.
#
# What a broker's read path can at best deliver over a pipe: its responses already made, just
# copied from one process to another. The script
#
#   1. makes a file of random bytes (default 1 GiB) and, once, the broker's answers for reading
#      all of it: JSON-RPC response lines, one per 8 MiB raw chunk, the chunk as base64 in
#      result.content (so 4/3 of the file's bytes, plus a few dozen per line);
#   2. times `cat ANSWERS | cat > /dev/null` -- cat moves 128 KiB per write/read -- twice:
#        default pipe   the pipe as the kernel makes it (64 KiB)
#        1 MiB pipe     the pipe grown to 1 MiB (F_SETPIPE_SZ, as fsbroker does to its stdout)
#      bash cannot call fcntl, so the reading side goes through a small python3 helper that
#      sets the pipe size on its stdin (F_SETPIPE_SZ = 1031, nothing for the default pipe) and
#      then execs cat; both variants go through it, so both pay the same start-up;
#   3. times `sftp -q -D sftp-server -b -` doing `get FILE /dev/null` (the same command
#      `fsbroker bench --compare-sftp` runs: OpenSSH's own request size and count);
#   4. prints MB/s of *raw file bytes* (file size / seconds, 10^6 bytes), so the figures compare
#      with fsbroker bench's read MB/s, the wire rate of the encoded stream, and the ratios.
#
# Each variant runs --repeat times (interleaved) and the median is reported. Everything is read
# from the page cache (read once before timing). Temp files are removed on exit.
#
# Usage: benches/pipe_ceiling.sh [--size SIZE] [--chunk SIZE] [--repeat N]
#   --size    file size, bytes or with KiB/MiB/GiB/kB/MB/GB  [default: 1GiB]
#   --chunk   raw bytes per response line                     [default: 8MiB]
#   --repeat  runs per variant, median reported               [default: 3]
# Needs: bash, coreutils, python3, sftp and sftp-server (openssh-client, openssh-sftp-server).

set -euo pipefail

size_arg=1GiB
chunk_arg=8MiB
repeat=3

usage() { sed -n '/^# Usage:/,/^# Needs:/s/^# \{0,1\}//p' "$0"; }

while (($#)); do
    case "$1" in
        --size) size_arg=${2:?--size needs a value}; shift 2 ;;
        --size=*) size_arg=${1#*=}; shift ;;
        --chunk) chunk_arg=${2:?--chunk needs a value}; shift 2 ;;
        --chunk=*) chunk_arg=${1#*=}; shift ;;
        --repeat) repeat=${2:?--repeat needs a value}; shift 2 ;;
        --repeat=*) repeat=${1#*=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

bytes() { # 1GiB -> 1073741824
    local text=$1 num unit
    if [[ ! $text =~ ^([0-9]+)([A-Za-z]*)$ ]]; then
        echo "bad size: $text" >&2; return 1
    fi
    num=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[2],,}
    case "$unit" in
        "" | b) echo $((num)) ;;
        k | kib) echo $((num << 10)) ;;
        m | mib) echo $((num << 20)) ;;
        g | gib) echo $((num << 30)) ;;
        kb) echo $((num * 1000)) ;;
        mb) echo $((num * 1000000)) ;;
        gb) echo $((num * 1000000000)) ;;
        *) echo "bad size unit: $text" >&2; return 1 ;;
    esac
}

size=$(bytes "$size_arg")
chunk=$(bytes "$chunk_arg")
[[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "--repeat must be a positive number" >&2; exit 2; }
((size > 0 && chunk > 0)) || { echo "sizes must be above 0" >&2; exit 2; }

sftp_client=$(command -v sftp || true)
sftp_server=
for s in /usr/lib/openssh/sftp-server /usr/libexec/sftp-server /usr/lib/sftp-server /usr/libexec/openssh/sftp-server; do
    if [[ -x $s ]]; then sftp_server=$s; break; fi
done
# The interpreter itself, not a wrapper (a pyenv shim takes ~0.2 s to start, which would land in
# the timings); -I -S keeps its start-up to a few tens of milliseconds.
py=$(python3 -c 'import sys; print(sys.executable)') || { echo "python3 is needed" >&2; exit 1; }

pipe_max=$(cat /proc/sys/fs/pipe-max-size 2>/dev/null || echo 1048576)
grown=$((1 << 20))
if ((grown > pipe_max)) && ((EUID != 0)); then
    echo "note: fs.pipe-max-size is $pipe_max; the grown pipe gets that instead of 1 MiB" >&2
    grown=$pipe_max
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipe-ceiling.XXXXXX")
cleanup() { rm -rf -- "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

raw=$tmp/raw.bin
answers=$tmp/answers.jsonl

say() { printf '%s\n' "$*" >&2; }

say "making $size bytes of random data and its answers in $chunk-byte chunks ..."
head -c "$size" /dev/urandom >"$raw"
"$py" - "$raw" "$answers" "$chunk" <<'PY'
import base64, json, os, sys
raw, out, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3])
size = os.path.getsize(raw)
with open(raw, "rb") as src, open(out, "wb") as dst:
    offset, rid = 0, 1
    while True:
        data = src.read(chunk)
        if not data and offset:
            break
        eof = offset + len(data) >= size
        # The shape of a files/read answer; only result.content is big.
        head = b'{"jsonrpc":"2.0","id":%d,"result":{"content":"' % rid
        tail = json.dumps({"encoding": "base64", "size": size, "offset": offset,
                           "length": len(data), "eof": eof,
                           "mimeType": "application/octet-stream",
                           "etag": "0123456789abcdef"}, separators=(",", ":"))
        dst.write(head + base64.b64encode(data) + b'",' + tail[1:].encode() + b"}\n")
        offset += len(data)
        rid += 1
        if eof:
            break
PY
encoded=$(stat -c %s "$answers")
lines=$(wc -l <"$answers")
cat "$raw" "$answers" >/dev/null # into the page cache

# The reading end: sets the size of the pipe on its stdin (0: leave it), checks it, execs cat.
reader() {
    "$py" -I -S -c '
import fcntl, os, sys
want = int(sys.argv[1])
if want:
    fcntl.fcntl(0, 1031, want)          # F_SETPIPE_SZ
got = fcntl.fcntl(0, 1032)              # F_GETPIPE_SZ
with open(sys.argv[2], "w") as f:
    f.write(str(got))
os.execvp("cat", ["cat"])
' "$1" "$2"
}

now() { date +%s.%N; }

# One timed run of a variant; prints the seconds it took.
run() {
    local t0 t1
    case "$1" in
        default)
            t0=$(now); cat "$answers" | reader 0 "$tmp/pipe.default" >/dev/null; t1=$(now) ;;
        grown)
            t0=$(now); cat "$answers" | reader "$grown" "$tmp/pipe.grown" >/dev/null; t1=$(now) ;;
        startup) # the same pipeline with nothing to copy
            t0=$(now); : | reader 0 "$tmp/pipe.startup" >/dev/null; t1=$(now) ;;
        sftp)
            t0=$(now)
            printf 'get "%s" /dev/null\n' "$raw" |
                "$sftp_client" -q -D "$sftp_server" -b - >/dev/null
            t1=$(now) ;;
    esac
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f\n", b - a }'
}

median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
rate() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.0f\n", n / s / 1e6 }'; } # bytes seconds -> MB/s

variants=(default grown)
if [[ -n $sftp_client && -n $sftp_server ]]; then
    variants+=(sftp)
else
    say "sftp or sftp-server missing: only the pipe is measured"
fi

declare -A times
for ((r = 1; r <= 3; r++)); do times[startup]+="$(run startup) "; done
for ((r = 1; r <= repeat; r++)); do
    for v in "${variants[@]}"; do
        s=$(run "$v")
        times[$v]+="$s "
        say "run $r/$repeat $(printf '%-8s' "$v") ${s:0:6}s  $(rate "$size" "$s") MB/s"
    done
done

med() { tr ' ' '\n' <<<"${times[$1]}" | grep . | median; }

echo "pipe ceiling: $size-byte file ($((size >> 20)) MiB), $lines answers of $chunk raw bytes," \
    "$encoded bytes encoded; median of $repeat; $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load $(cut -d" " -f1-3 /proc/loadavg)"
printf '%-38s %9s %12s %12s\n' "" seconds "MB/s (file)" "MB/s (wire)"
row() { # label variant bytes-on-the-wire
    local s
    s=$(med "$2")
    printf '%-38s %9.3f %12s %12s\n' "$1" "$s" "$(rate "$size" "$s")" "$(rate "$3" "$s")"
}
printf '%-38s %9.3f   (start-up of the pipe variants, in their times)\n' "empty pipe, same reader" "$(med startup)"
row "cat answers | cat, pipe $(($(cat "$tmp/pipe.default") >> 10)) KiB" default "$encoded"
row "cat answers | cat, pipe $(($(cat "$tmp/pipe.grown") >> 10)) KiB" grown "$encoded"
if [[ -n ${times[sftp]:-} ]]; then
    row "sftp -D sftp-server get FILE /dev/null" sftp "$size"
    awk -v d="$(med default)" -v g="$(med grown)" -v s="$(med sftp)" 'BEGIN {
        printf "ratio pipe ceiling / sftp (file MB/s): default pipe %.2f, grown pipe %.2f\n", s / d, s / g }'
fi
