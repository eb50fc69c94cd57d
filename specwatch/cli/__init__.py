"""Subcommands. Each module: ``add_parser(subparsers)`` sets ``handler=main`` via set_defaults."""
