"""``specwatch doctor``; may import cli, server, settings, alerts, shadow, core, tools.prom_api.

:mod:`.command` holds the checks of the config, the manifests and the ledger volume and the
subcommand; :mod:`.stack` the checks of a running stack through Prometheus' HTTP API;
:mod:`.deployed` the checks of how specwatch is deployed (the ledger's filesystem, the
Alertmanager peers, dashboards exported for sharing, rule ranges, a native sidecar's drain).
"""
