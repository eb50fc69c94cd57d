"""``specwatch power``: paired questions needed to detect a net loss (Connor 1987)."""

from __future__ import annotations

import argparse
import json
import sys

from specwatch.cli.args import add_output_format, plain_help


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``power``."""
    p = subparsers.add_parser(
        "power",
        help="questions needed to detect a net accuracy loss with a paired McNemar test",
        description=plain_help(__doc__ or ""),
    )
    p.add_argument(
        "--net-loss",
        type=float,
        required=True,
        help="net accuracy loss to detect, a fraction (0.02 = 2 points)",
    )
    p.add_argument(
        "--discordant",
        type=float,
        required=True,
        help="expected share of questions that flip either way (e.g. 0.06)",
    )
    p.add_argument("--alpha", type=float, default=0.05, help="two-sided level (default 0.05)")
    p.add_argument("--power", type=float, default=0.8, help="power (default 0.8)")
    add_output_format(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    """Print ``questions_needed``; 2 on out-of-range input."""
    from specwatch.shadow.stats.power import questions_needed  # scipy loads only here

    try:
        n = questions_needed(args.net_loss, args.discordant, alpha=args.alpha, power=args.power)
    except ValueError as exc:
        print(f"specwatch power: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(
            json.dumps(
                {
                    "questions_needed": n,
                    "net_loss": args.net_loss,
                    "discordant": args.discordant,
                    "alpha": args.alpha,
                    "power": args.power,
                }
            )
        )
    else:
        print(f"questions_needed {n}")
    return 0
