"""``specwatch power``: paired questions needed to detect a net loss: the exact McNemar test's
sample size and power, beside Connor's (1987) normal approximation."""

from __future__ import annotations

import argparse
import json
import sys

from specwatch.cli.args import add_output_format, output_format
from specwatch.core.helptext import plain_help


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
    """Print ``exact_questions_needed`` (the exact test reaches the power there),
    ``questions_needed`` (Connor) and the exact test's power at Connor's n; 2 on out-of-range
    input."""
    from specwatch.shadow.stats.power import (  # scipy loads only here
        exact_power,
        exact_questions_needed,
        questions_needed,
    )

    try:
        n = questions_needed(args.net_loss, args.discordant, alpha=args.alpha, power=args.power)
        exact = exact_questions_needed(
            args.net_loss, args.discordant, alpha=args.alpha, power=args.power
        )
        at_connor = exact_power(n, args.net_loss, args.discordant, alpha=args.alpha)
    except ValueError as exc:
        print(f"specwatch power: {exc}", file=sys.stderr)
        return 2
    if output_format(args.format) == "json":
        print(
            json.dumps(
                {
                    "exact_questions_needed": exact,
                    "questions_needed": n,
                    "exact_power_at_questions_needed": at_connor,
                    "net_loss": args.net_loss,
                    "discordant": args.discordant,
                    "alpha": args.alpha,
                    "power": args.power,
                }
            )
        )
    else:
        print(f"exact_questions_needed {exact} (exact McNemar test)")
        print(f"questions_needed {n} (Connor's normal approximation; exact power {at_connor:.3f})")
    return 0
