"""The sidecar's, simulator's and demo's subcommands; may import demo and all below, simulate.

Each module: ``add_parser(subparsers)`` sets ``handler=main`` via set_defaults.
"""
