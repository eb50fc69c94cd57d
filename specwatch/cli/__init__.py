"""Subcommands; may import demo and everything below it, simulate and report.

Each module: ``add_parser(subparsers)`` sets ``handler=main`` via set_defaults.
"""
