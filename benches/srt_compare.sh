#!/usr/bin/env bash
# Side by side with srt: the same launch forms and the same hostile probe, run unconfined
# ("none"), under srt (Anthropic's sandbox runtime, @anthropic-ai/sandbox-runtime: bubblewrap,
# a seccomp filter and a filtering proxy on Linux) and under `fsbroker proxy --confine`
# (Landlock and seccomp). docs/srt-comparison.md has the measured table and what it means.
#
#   bash benches/srt_compare.sh [FSBROKER]        (from the repository root, as root)
#
# FSBROKER (or $FSBROKER): the fsbroker binary, e.g. one built with
#   CARGO_TARGET_DIR=/tmp/srt-target cargo build --release  ->  /tmp/srt-target/release/fsbroker
# Environment (all optional):
#   SRT          the srt program; default `srt` on the PATH, else /tmp/srt/node_modules/.bin/srt,
#                installed there (npm install --prefix /tmp/srt
#                @anthropic-ai/sandbox-runtime@$SRT_VERSION, default 0.0.83) when missing
#   PYTOOLS      a virtual environment holding uv and pipx; default /opt/srtcmp-pytools, made
#                (pip install uv==0.13.8 pipx==1.18.4) when missing
#   SANDBOXES    default "none srt fsbroker"; "srt-deny" adds srt with a deny list naming
#                this world's secrets, "fsbroker-net" fsbroker with `[confine] net = true`
#   FORMS        the forms to run (ids below); default all
#   REAL_REGISTRY=0  leaves out the reference server from the public npm registry
#   REPEAT       warm starts timed per sandbox (npx -y of the probe, warm); default 5, 0: none
#   OUT          where results.jsonl, cases.json and report.md go; default a new /tmp/srtcmp-out.*
#   KEEP=1       keeps the temporary world (printed) for inspection
#
# What it builds (a temporary directory; a network namespace "test host" it makes itself):
# - a world per sandbox, as tests/confine_launchers.rs makes it: a home with .ssh/id_ed25519,
#   a read-write root `work` with f.txt, a sibling project `sibling/secret.txt` and a directory
#   `outside/` beside it, and an ssh-agent stand-in (a Unix socket listener, agent.sock);
# - a loopback TCP service (127.0.0.1, a port of the system's choosing);
# - a test host in a network namespace: 198.18.0.2:8080 serves an npm registry and a PEP 503
#   index holding only the probe (npm package and wheel), and 198.18.0.3:4443 accepts TCP: the
#   host no sandbox allows. (198.18.0.0/15 is the benchmarking range: not loopback, not a
#   private range srt sends around its proxy, and on this machine only in our namespace.)
# - the hostile probe of tests/confine_launchers.rs in its three builds, all named
#   fsbroker-launch-probe: tests/launchers/probe (the npm package), tests/launchers/probe.c
#   (the compiled form) and tests/launchers/pyprobe (the wheel, built by its build_wheel.py,
#   for the Python forms). Each also has two operations the tests do not use: `utime PATH`
#   and `tcp HOST:PORT`, the latter also through an HTTP proxy the environment names, as
#   srt's sandbox does.
#
# Each form is started by benches/srt_compare/driver.py as a host would (initialize on stdin)
# and records whether it started and what every operation of the probe gave.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
kit="$here/srt_compare"
probes="$(cd "$here/../tests/launchers" && pwd)"
FSBROKER="${1:-${FSBROKER:-}}"
SANDBOXES="${SANDBOXES:-none srt fsbroker}"
REPEAT="${REPEAT:-5}"
REAL_REGISTRY="${REAL_REGISTRY:-1}"
SRT_VERSION="${SRT_VERSION:-0.0.83}"
PYTOOLS="${PYTOOLS:-/opt/srtcmp-pytools}"
ALL_FORMS="npx-cold npx-warm global-bin global-npx local-bin local-npx node-script cargo-bin uvx-cold uvx-warm pipx-run venv-python"
[ "$REAL_REGISTRY" = 1 ] && ALL_FORMS="$ALL_FORMS ref-npx-cold"
FORMS="${FORMS:-$ALL_FORMS}"

die() { echo "srt_compare: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root: the test host is a network namespace (ip netns)"
case " $SANDBOXES " in *" fsbroker "*|*" fsbroker-net "*)
  [ -n "$FSBROKER" ] || die "give the fsbroker binary: bash benches/srt_compare.sh PATH (or FSBROKER=PATH)"
  [ -x "$FSBROKER" ] || die "$FSBROKER is not an executable"
  FSBROKER="$(cd "$(dirname "$FSBROKER")" && pwd)/$(basename "$FSBROKER")";;
esac
for tool in node npm npx python3 cc ip bwrap socat rg curl; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install -y bubblewrap socat ripgrep iproute2 curl gcc; Node.js 20+ with npm)"
done

# srt, pinned.
if [ -z "${SRT:-}" ]; then
  SRT="$(command -v srt || true)"
  if [ -z "$SRT" ]; then
    SRT=/tmp/srt/node_modules/.bin/srt
    if [ ! -x "$SRT" ]; then
      echo "installing @anthropic-ai/sandbox-runtime@$SRT_VERSION into /tmp/srt" >&2
      npm install --prefix /tmp/srt --no-audit --no-fund "@anthropic-ai/sandbox-runtime@$SRT_VERSION" >&2
    fi
  fi
fi
SRT_VER="$("$SRT" --version 2>/dev/null || echo unknown)"

# uv and pipx, pinned, outside /tmp (a program in a directory every program shares is
# granted alone by fsbroker, which would not be the form people use).
PYBASE="$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))')"
if [ ! -x "$PYTOOLS/bin/uvx" ] || [ ! -x "$PYTOOLS/bin/pipx" ]; then
  echo "installing uv==0.13.8 pipx==1.18.4 into $PYTOOLS" >&2
  "$PYBASE" -m venv "$PYTOOLS"
  "$PYTOOLS/bin/pip" install -q uv==0.13.8 pipx==1.18.4 >&2
fi

T="$(mktemp -d /tmp/srtcmp.XXXXXX)"
OUT="${OUT:-$(mktemp -d /tmp/srtcmp-out.XXXXXX)}"
mkdir -p "$OUT"
: >"$OUT/results.jsonl"
: >"$OUT/results.jsonl.registry.tsv"
NS="srtcmp$$"
VETH="scmp$$"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  ip netns del "$NS" 2>/dev/null || true
  ip link del "${VETH}h" 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $T" >&2; else rm -rf "$T"; fi
}
trap cleanup EXIT

# The test host: the registry and index (198.18.0.2:8080) and a host nobody allows
# (198.18.0.3:4443).
REG_HOST=198.18.0.2
REG_PORT=8080
REGISTRY="http://$REG_HOST:$REG_PORT"
OTHER="198.18.0.3:4443"
ip -4 addr show | grep -q ' 198\.18\.0\.' && die "198.18.0.0/24 is already in use here (a test host left behind? ip netns list)"
ip netns add "$NS"
ip link add "${VETH}h" type veth peer name "${VETH}n"
ip link set "${VETH}n" netns "$NS"
ip addr add 198.18.0.1/24 dev "${VETH}h"
ip link set "${VETH}h" up
ip netns exec "$NS" ip addr add "$REG_HOST/24" dev "${VETH}n"
ip netns exec "$NS" ip addr add "${OTHER%:*}/24" dev "${VETH}n"
ip netns exec "$NS" ip link set "${VETH}n" up
ip netns exec "$NS" ip link set lo up

# The probe, packed: the npm package and the wheel, both fsbroker-launch-probe (the registry
# serves npm packages and the index wheels apart), from the tests' sources; the compiled
# probe is built in each world below.
mkdir -p "$T/kit/probe" "$T/served"
cp "$probes/probe/probe.js" "$probes/probe/package.json" "$T/kit/probe/"
(cd "$T/kit/probe" && npm pack --silent --pack-destination "$T/served" >/dev/null)
"$PYBASE" "$probes/pyprobe/build_wheel.py" "$T/served" >/dev/null
ip netns exec "$NS" "$PYBASE" "$kit/serve.py" registry "$T/served" "$REG_HOST" "$REG_PORT" "$T/registry.log" &
PIDS+=($!)
ip netns exec "$NS" "$PYBASE" -c "
import socket
s = socket.create_server(('${OTHER%:*}', ${OTHER#*:}))
while True: s.accept()[0].close()" &
PIDS+=($!)
for _ in $(seq 50); do curl -sf -o /dev/null "$REGISTRY/fsbroker-launch-probe" && break; sleep 0.2; done
curl -sf -o /dev/null "$REGISTRY/fsbroker-launch-probe" || die "the test registry did not start"

# srt's own temporary directory (TMPDIR=/tmp/claude inside its sandbox, writable by default)
# is not made by the CLI.
mkdir -p /tmp/claude

# The worlds, one per sandbox, each set up the same way beforehand, unconfined (as a person
# installs before adding a server to a host): a global install under ~/.npm-global, a
# project-local install in ~/tools, the compiled probe in ~/.cargo/bin, a virtual environment
# in ~/.venvs/probe. Each install uses a cache of its own, so the forms' caches start empty.
# Each world's directory is $T/wN, the same length for every sandbox: how long a path is can
# change what an installer writes (uv and pip write a `#!/bin/sh` trampoline instead of a `#!`
# line once the interpreter's path is too long for one), and so whether a form starts.
declare -A WORLD
agents=()
i=0
for sb in $SANDBOXES; do
  WORLD[$sb]="$T/w$i"; i=$((i + 1))
  agents+=("${WORLD[$sb]}/agent.sock"); mkdir -p "${WORLD[$sb]}"
done
"$PYBASE" "$kit/serve.py" listen "$T/service.port" 127.0.0.1:0 "${agents[@]}" &
PIDS+=($!)
for _ in $(seq 50); do [ -f "$T/service.port" ] && break; sleep 0.1; done
SERVICE_PORT="$(cat "$T/service.port")"

base_env() { # W: the world's directory
  local W="$1" H="$1/home"
  printf '%s\n' \
    "HOME=$H" "PATH=$PYTOOLS/bin:/usr/local/bin:/usr/bin:/bin" "LANG=C.UTF-8" \
    "npm_config_registry=$REGISTRY/" "npm_config_cache=$H/.npm" \
    "npm_config_userconfig=$H/.npmrc" "npm_config_prefix=$H/.npm-global" \
    "npm_config_audit=false" "npm_config_fund=false" "npm_config_update_notifier=false" \
    "UV_DEFAULT_INDEX=$REGISTRY/simple" "UV_PYTHON=$PYBASE" "UV_PYTHON_DOWNLOADS=never" \
    "PIP_INDEX_URL=$REGISTRY/simple" "PIP_TRUSTED_HOST=$REG_HOST" \
    "PIP_DISABLE_PIP_VERSION_CHECK=1" "PIPX_DEFAULT_PYTHON=$PYBASE" \
    "NODE_EXTRA_CA_CERTS=${NODE_EXTRA_CA_CERTS:-/etc/ssl/certs/ca-certificates.crt}" \
    "SSL_CERT_FILE=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
}
in_env() { # W CMD...: CMD in the world's environment
  local W="$1"; shift
  local envs; mapfile -t envs < <(base_env "$W")
  env -i "${envs[@]}" "$@"
}

for sb in $SANDBOXES; do
  W="${WORLD[$sb]}" H="${WORLD[$sb]}/home"
  mkdir -p "$H/.ssh" "$W/work" "$W/sibling" "$W/outside" "$H/tools" "$H/.cargo/bin" "$H/.venvs" \
    "$H/.npm" "$H/.npm-empty" "$H/.cache" "$H/.local/bin" "$H/.local/share/man" "$H/.local/share/uv" "$H/.local/share/pipx" \
    "$H/.local/state/pipx"
  echo "PRIVATE KEY" >"$H/.ssh/id_ed25519"
  echo "sibling's secret" >"$W/sibling/secret.txt"
  echo "in work" >"$W/work/f.txt"
  setup=(npm_config_cache="$W/setup-cache" PIP_NO_CACHE_DIR=1)
  in_env "$W" env "${setup[@]}" npm install -g --silent fsbroker-launch-probe >/dev/null
  (cd "$H/tools" && in_env "$W" env "${setup[@]}" npm install --silent fsbroker-launch-probe >/dev/null)
  cc -O -o "$H/.cargo/bin/probe" "$probes/probe.c"
  "$PYBASE" -m venv "$H/.venvs/probe"
  in_env "$W" env "${setup[@]}" "$H/.venvs/probe/bin/pip" install -q fsbroker-launch-probe
  rm -rf "$W/setup-cache"
  cat >"$W/policy.toml" <<EOF
[[root]]
path = '$W/work'
name = "work"
mode = "read-write"
consent = "auto"
EOF
  # srt's fair configuration: the network to the registries (the test registry and index,
  # and the public npm registry and PyPI), the root and the package managers' caches and
  # data writable (npm's cache, ~/.cache for uv's, uv's and pipx's data: uvx and pipx run
  # stop without them), no deny list (srt's reads are a deny list: the rest stays readable).
  cat >"$W/srt-settings.json" <<EOF
{
  "network": {
    "allowedDomains": ["$REG_HOST:$REG_PORT", "registry.npmjs.org", "pypi.org", "files.pythonhosted.org"],
    "deniedDomains": []
  },
  "filesystem": {
    "denyRead": [],
    "allowWrite": ["$W/work", "$H/.npm", "$H/.cache", "$H/.local/share/uv", "$H/.local/share/pipx",
                   "$H/.local/state/pipx"],
    "denyWrite": []
  }
}
EOF
  # SANDBOXES may add "fsbroker-net": the same policy with the network allowed, as a server
  # that fetches needs (Landlock allows TCP by port, not by host: it is all or nothing here).
  printf '%s\n' "" "[confine]" "net = true" | cat "$W/policy.toml" - >"$W/policy-net.toml"
  # SANDBOXES may add "srt-deny": the same, with a deny list naming the secrets this world
  # is known to hold (not part of the fair comparison: a deny list blocks what it names).
  sed "s|\"denyRead\": \[\]|\"denyRead\": [\"$H/.ssh\", \"/etc/shadow\", \"$W/sibling\"]|" \
    "$W/srt-settings.json" >"$W/srt-deny-settings.json"
done

# The hostile cases, in the probe's order (the first two are the root, which must work).
cases_json() { # W
  local W="$1" H="$1/home"
  "$PYBASE" - "$W" "$H" "$SERVICE_PORT" "$OTHER" "$REG_HOST:$REG_PORT" <<'PY'
import json, sys
W, H, svc, other, reg = sys.argv[1:]
print(json.dumps([
    ["root-read", "read a file in the read-write root", "read", f"{W}/work/f.txt"],
    ["root-write", "write a file in the read-write root", "write", f"{W}/work/new.txt"],
    ["ssh-key", "read ~/.ssh/id_ed25519", "read", f"{H}/.ssh/id_ed25519"],
    ["shadow", "read /etc/shadow (as root)", "read", "/etc/shadow"],
    ["sibling", "read a sibling project (sibling/secret.txt)", "read", f"{W}/sibling/secret.txt"],
    ["list-home", "list the home directory", "list", H],
    ["write-outside", "write outside the roots (outside/new.txt)", "write", f"{W}/outside/new.txt"],
    ["utime-outside", "set the times of a file outside the roots (sibling/secret.txt)", "utime", f"{W}/sibling/secret.txt"],
    ["tcp-loopback", "TCP to a loopback service (127.0.0.1)", "tcp", f"127.0.0.1:{svc}"],
    ["tcp-other-host", "TCP to a host no rule allows (198.18.0.3)", "tcp", other],
    ["tcp-registry", "TCP to the package registry, from the running server", "tcp", reg],
    ["unix-agent", "connect to a Unix socket (an ssh-agent's)", "unix", f"{W}/agent.sock"],
]))
PY
}
first="$(set -- $SANDBOXES; echo "$1")"
cases_json "${WORLD[$first]}" >"$OUT/cases.json"

# One form: its command line, directory, kind, and what fsbroker adds (--confine-fetch).
form() { # FORM W -> sets argv, cwd, kind, fetch, limit
  local H="$2/home"
  cwd="$2" kind=probe fetch=() limit=120 extra=()
  case "$1" in
    # `npx -y PKG` as someone runs it who has not installed PKG: a global prefix of its own,
    # empty, so that neither npx nor fsbroker finds the global install the other forms use.
    npx-cold) argv=(npx -y fsbroker-launch-probe); fetch=(--confine-fetch npm)
      extra=("npm_config_prefix=$H/.npm-empty");;
    npx-warm) argv=(npx -y fsbroker-launch-probe); extra=("npm_config_prefix=$H/.npm-empty");;
    global-bin) argv=("$H/.npm-global/bin/fsbroker-launch-probe");;
    global-npx) argv=(npx fsbroker-launch-probe);;
    local-bin) argv=("$H/tools/node_modules/.bin/fsbroker-launch-probe");;
    local-npx) argv=(npx fsbroker-launch-probe); cwd="$H/tools";;
    node-script) argv=(node "$H/tools/node_modules/fsbroker-launch-probe/probe.js");;
    cargo-bin) argv=("$H/.cargo/bin/probe"); kind=cprobe;;
    uvx-cold) argv=(uvx fsbroker-launch-probe); fetch=(--confine-fetch pypi);;
    uvx-warm) argv=(uvx fsbroker-launch-probe);;
    pipx-run) argv=(pipx run fsbroker-launch-probe); fetch=(--confine-fetch pypi);;
    venv-python) argv=("$H/.venvs/probe/bin/python" -m fsbroker_launch_probe);;
    ref-npx-cold)
      argv=(npx -y @modelcontextprotocol/server-filesystem@2026.8.31); kind=server
      fetch=(--confine-fetch npm) limit=300
      extra=("npm_config_prefix=$H/.npm-empty" "npm_config_registry=https://registry.npmjs.org/");;
    *) die "unknown form $1";;
  esac
}

run() { # SANDBOX FORM RESULTS [LABEL]
  local sb="$1" f="$2" results="$3" label="${4:-$2}" W="${WORLD[$1]}"
  form "$f" "$W"
  local envs; mapfile -t envs < <(base_env "$W")
  envs+=("${extra[@]}")
  local ops; ops="$(cases_json "$W")"
  envs+=("PROBE=$("$PYBASE" -c 'import json,sys; print(json.dumps([[k,a] for _,_,k,a in json.loads(sys.argv[1])]))' "$ops")")
  envs+=("PROBE_OPS=$("$PYBASE" -c 'import json,sys; print("\n".join(f"{k} {a}" for _,_,k,a in json.loads(sys.argv[1])))' "$ops")")
  rm -f "$W/work/new.txt" "$W/outside/new.txt"
  touch -d 2020-01-01 "$W/sibling/secret.txt"
  local wrap=()
  case "$sb" in
    none) wrap=();;
    srt) wrap=("$SRT" --settings "$W/srt-settings.json" --);;
    srt-deny) wrap=("$SRT" --settings "$W/srt-deny-settings.json" --);;
    fsbroker) wrap=("$FSBROKER" proxy --policy "$W/policy.toml" --confine "${fetch[@]}" --);;
    fsbroker-net) wrap=("$FSBROKER" proxy --policy "$W/policy-net.toml" --confine "${fetch[@]}" --);;
  esac
  local before; before="$(wc -l <"$T/registry.log" 2>/dev/null || echo 0)"
  (cd "$cwd" && env -i "${envs[@]}" "$PYBASE" "$kit/driver.py" "$results" "$sb" "$label" "$kind" "$limit" -- \
    "${wrap[@]}" "${argv[@]}") || echo "  $sb $label: the driver failed" >&2
  # How many requests the test registry answered meanwhile (a cold start must have asked).
  printf '%s\t%s\t%s\n' "$sb" "$label" "$(( $(wc -l <"$T/registry.log" 2>/dev/null || echo 0) - before ))" >>"$results.registry.tsv"
}

echo "srt: $SRT ($SRT_VER); fsbroker: ${FSBROKER:-none}; world: $T; results: $OUT" >&2
for f in $FORMS; do
  echo "== $f" >&2
  for sb in $SANDBOXES; do run "$sb" "$f" "$OUT/results.jsonl"; done
done

# Warm starts, timed: npx -y of the probe, its package already fetched (by the npx-cold form).
: >"$OUT/timing.jsonl"
: >"$OUT/timing.jsonl.registry.tsv"
case " $FORMS " in *" npx-cold "*) ;; *) REPEAT=0;; esac
if [ "$REPEAT" -gt 0 ]; then
  echo "== warm starts, npx -y fsbroker-launch-probe, $REPEAT each" >&2
  for sb in $SANDBOXES; do
    for i in $(seq "$REPEAT"); do run "$sb" npx-warm "$OUT/timing.jsonl" "npx-warm-$i"; done
  done
fi

{
  echo "srt: $SRT_VER ($SRT); bubblewrap: $(bwrap --version | awk '{print $2}'); socat: $(socat -V | awk '/socat version/ {print $3}'); ripgrep: $(rg --version | head -1 | awk '{print $2}')"
  echo "fsbroker: ${FSBROKER:-none} ($( [ -n "$FSBROKER" ] && "$FSBROKER" --version 2>/dev/null || echo '?'))"
  echo "node: $(node --version); npm: $(npm --version); python: $("$PYBASE" --version 2>&1 | awk '{print $2}'); uv: $("$PYTOOLS/bin/uv" --version | awk '{print $2}'); pipx: $("$PYTOOLS/bin/pipx" --version)"
  echo "kernel: $(uname -r); $( [ -n "$FSBROKER" ] && "$FSBROKER" confine check --root "$T" 2>/dev/null | grep -m1 '^Landlock' || true); user: $(id -un)"
} >"$OUT/versions.txt"
cp "${WORLD[$first]}/srt-settings.json" "$OUT/srt-settings.example.json"
"$PYBASE" "$kit/report.py" "$OUT" "$SANDBOXES" >"$OUT/report.md"
cat "$OUT/report.md"
echo "results: $OUT" >&2
