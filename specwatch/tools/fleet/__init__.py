"""``specwatch fleet``; may import cli, export, shadow, core, tools.prom_api.

:mod:`.stats` is pure (Prometheus rows -> ``FleetStats`` -> ``specwatch_fleet_*``),
:mod:`.catalogue` its metric families, :mod:`.server` the queries, refresh loop and /metrics of
``--listen``, :mod:`.command` the subcommand.
"""
