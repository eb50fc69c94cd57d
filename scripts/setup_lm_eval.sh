#!/usr/bin/env bash
# Build, once, the separate Python venv holding lm-evaluation-harness (pip `lm-eval`) for the
# test that feeds a real lm-eval run to `specwatch paired-test`.
#
# lm-eval is never a dependency of specwatch: it lives in its own venv, the test runs it as a
# process against `specwatch simulate` (its OpenAI-compatible completions model type) and reads
# the samples_*.jsonl files it writes. The venv is reused while it imports; a half-built one
# (no stamp file) is removed and built again. Concurrent callers serialise on a lock file
# (scripts/lib/venv.sh).
#
# Environment:
#   SPECWATCH_LM_EVAL_VENV         where the venv lives (default: $HOME/.cache/specwatch/venv-lm-eval)
#   SPECWATCH_LM_EVAL_BASE_PYTHON  interpreter that creates it (default: python3)
# Prints the venv's python path as the last line of stdout.
set -euo pipefail
# shellcheck source=lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"

LM_EVAL_REQUIREMENT="lm-eval[api]==0.4.13"
LM_EVAL_VERSION="0.4.13"
VENV_CONSTRAINTS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/requirements/lm-eval-constraints.txt"
VENV_LOG_NAME=setup_lm_eval
VENV="${SPECWATCH_LM_EVAL_VENV:-$HOME/.cache/specwatch/venv-lm-eval}"
BASE_PYTHON="${SPECWATCH_LM_EVAL_BASE_PYTHON:-python3}"
VENV_STAMP="$VENV/.specwatch-lm-eval-ok"
VENV_WHAT="$LM_EVAL_REQUIREMENT"
VENV_BROKEN="the new venv does not import lm_eval $LM_EVAL_VERSION; run: $VENV/bin/python -c 'import lm_eval'"

venv_probe() {
  "$VENV/bin/python" - "$LM_EVAL_VERSION" <<'PY'
import importlib.metadata
import sys

import lm_eval  # noqa: F401
import tenacity  # noqa: F401  (the [api] extra, for local-completions)
from lm_eval.models import openai_completions  # noqa: F401

sys.exit(0 if importlib.metadata.version("lm_eval") == sys.argv[1] else 1)
PY
}

venv_install() {
  venv_pip install "$LM_EVAL_REQUIREMENT"
}

venv_setup
