# shellcheck shell=bash
# The one home of the cached-venv logic shared by scripts/setup_vllm.sh and scripts/setup_lm_eval.sh:
# a separate Python venv, built once, reused while it imports; a half-built one (no stamp file) is
# removed and built again; concurrent callers serialise on "$VENV.lock" (flock).
#
# Source it, set these variables, define these functions, then call `venv_setup`:
#   VENV_LOG_NAME  prefix of the log lines on stderr (e.g. setup_vllm)
#   VENV           where the venv lives
#   BASE_PYTHON    the interpreter that creates it
#   VENV_STAMP     the stamp file written after a verified build (inside $VENV)
#   VENV_WHAT      what the build installs, for the "building" log line
#   VENV_BROKEN    the log line when a fresh build does not pass venv_probe
#   venv_probe     exit status 0 when "$VENV/bin/python" has what the venv is for (output is discarded)
#   venv_install   the install steps, each through `venv_pip ARGS...`
#   venv_prepare   optional: runs under the lock before a build (e.g. install the base interpreter)
# Every pip install in the venv takes `-c "$VENV_CONSTRAINTS"` when the caller sets it (a pip
# constraints file with exact pins); venv_pinned then tells whether the venv still holds those pins.
# venv_setup prints the venv's python path as the last line of stdout and exits the script:
# 0 when the venv is usable, 1 when a pip step or the final probe fails (pip's log tail on stderr).

venv_log() { echo "$VENV_LOG_NAME: $*" >&2; }

# 0 when every package pinned in $VENV_CONSTRAINTS (or none set) is installed in the venv at its pin;
# a venv built before the pins changed is then rebuilt instead of reused.
venv_pinned() {
  [[ -n "${VENV_CONSTRAINTS:-}" ]] || return 0
  "$VENV/bin/python" - "$VENV_CONSTRAINTS" <<'PY'
import importlib.metadata as md
import re
import sys

wrong = []
with open(sys.argv[1], encoding="utf-8") as f:
    for line in f:
        pin = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.split("#", 1)[0].strip())
        if pin is None:
            continue
        try:
            version = md.version(pin[1])
        except md.PackageNotFoundError:
            version = None
        if version != pin[2]:
            wrong.append(f"{pin[1]} {version} (pinned {pin[2]})")
if wrong:
    sys.exit("not at the pinned versions: " + ", ".join(wrong))
PY
}

# 0 when the stamp is there and the venv's python passes the caller's probe.
venv_ok() {
  [[ -f "$VENV_STAMP" && -x "$VENV/bin/python" ]] || return 1
  venv_probe >/dev/null 2>&1 && venv_pinned >/dev/null 2>&1
}

venv_reuse_if_ok() {
  if venv_ok; then
    venv_log "reusing $VENV"
    echo "$VENV/bin/python"
    exit 0
  fi
}

# pip inside the venv, output to $VENV/pip-install.log; on failure the log's tail and exit 1.
venv_pip() {
  local install_log="$VENV/pip-install.log"
  local pins=()
  if [[ "$1" == install && -n "${VENV_CONSTRAINTS:-}" ]]; then
    pins=(-c "$VENV_CONSTRAINTS")
  fi
  if ! "$VENV/bin/python" -m pip "$@" "${pins[@]}" >>"$install_log" 2>&1; then
    tail -n 40 "$install_log" >&2
    venv_log "pip $* failed; full log in $install_log"
    exit 1
  fi
}

venv_setup() {
  venv_reuse_if_ok
  mkdir -p "$(dirname "$VENV")"
  exec 9>"$VENV.lock"
  flock 9
  venv_reuse_if_ok # another caller built it while we waited for the lock
  if declare -F venv_prepare >/dev/null; then
    venv_prepare
  fi
  local start
  start=$(date +%s)
  venv_log "building $VENV with $VENV_WHAT"
  rm -rf "$VENV"
  "$BASE_PYTHON" -m venv "$VENV"
  venv_pip install --upgrade pip
  venv_install
  touch "$VENV_STAMP"
  if ! venv_ok; then
    rm -f "$VENV_STAMP"
    venv_log "$VENV_BROKEN"
    exit 1
  fi
  venv_log "built in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1)"
  echo "$VENV/bin/python"
  exit 0
}
