"""Sidecar, simulator and demo subcommands; may import demo and everything below it, and simulate.

Each module: ``add_parser(subparsers)`` sets ``handler=main`` via set_defaults.
"""
