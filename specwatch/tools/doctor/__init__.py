"""``specwatch doctor``; may import cli, server, settings, alerts, core, tools.prom_api.

:mod:`.command` holds the checks of the config, the manifests and the ledger volume and the
subcommand; :mod:`.stack` the checks of a running stack through Prometheus' HTTP API.
"""
