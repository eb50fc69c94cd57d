"""Offline tools; may import cli, server, settings, export, alerts, observe, shadow, vllm, core.

The running sidecar (``specwatch run``: core, vllm, observe, shadow, alerts, export, server,
settings) never imports this package (an import-linter contract and
``tests/test_runtime_imports.py``). One folder per tool, each with its subcommand in
``command.py`` (``add_parser``, ``main``) beside its library code: :mod:`.doctor`, :mod:`.fleet`,
:mod:`.advise`, :mod:`.offline` (paired-test, bench-result, record, replay) and :mod:`.report`;
:mod:`.prom_api` is the Prometheus HTTP API client doctor and fleet share.
"""
