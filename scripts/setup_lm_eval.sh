#!/usr/bin/env bash
# Build, once, the separate Python venv holding lm-evaluation-harness (pip `lm-eval`) for the
# test that feeds a real lm-eval run to `specwatch paired-test`.
#
# lm-eval is never a dependency of specwatch: it lives in its own venv, the test runs it as a
# process against `specwatch simulate` (its OpenAI-compatible completions model type) and reads
# the samples_*.jsonl files it writes. The venv is reused while it imports; a half-built one
# (no stamp file) is removed and built again. Concurrent callers serialise on a lock file.
#
# Environment:
#   SPECWATCH_LM_EVAL_VENV         where the venv lives (default: $HOME/.cache/specwatch/venv-lm-eval)
#   SPECWATCH_LM_EVAL_BASE_PYTHON  interpreter that creates it (default: python3)
# Prints the venv's python path as the last line of stdout.
set -euo pipefail

LM_EVAL_REQUIREMENT="lm-eval[api]==0.4.13"
LM_EVAL_VERSION="0.4.13"
VENV="${SPECWATCH_LM_EVAL_VENV:-$HOME/.cache/specwatch/venv-lm-eval}"
BASE_PYTHON="${SPECWATCH_LM_EVAL_BASE_PYTHON:-python3}"
STAMP="$VENV/.specwatch-lm-eval-ok"

log() { echo "setup_lm_eval: $*" >&2; }

venv_ok() {
  [[ -f "$STAMP" && -x "$VENV/bin/python" ]] || return 1
  "$VENV/bin/python" - "$LM_EVAL_VERSION" >/dev/null 2>&1 <<'PY'
import importlib.metadata
import sys

import lm_eval  # noqa: F401
import tenacity  # noqa: F401  (the [api] extra, for local-completions)
from lm_eval.models import openai_completions  # noqa: F401

sys.exit(0 if importlib.metadata.version("lm_eval") == sys.argv[1] else 1)
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

start=$(date +%s)
log "building $VENV with $LM_EVAL_REQUIREMENT"
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
pip_quiet install "$LM_EVAL_REQUIREMENT"
touch "$STAMP"
if ! venv_ok; then
  rm -f "$STAMP"
  log "the new venv does not import lm_eval $LM_EVAL_VERSION; run: $VENV/bin/python -c 'import lm_eval'"
  exit 1
fi
log "built in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1)"
echo "$VENV/bin/python"
