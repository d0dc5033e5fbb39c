"""Argument types shared by the entries of tools/ (comma lists, shapes)."""

from __future__ import annotations

import argparse


def shape(text: str) -> tuple[int, int]:
    """``"4096x11008"`` -> (K, N)."""
    try:
        k, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not KxN, e.g. 4096x11008") from None
    return k, n


def shapes(text: str) -> list[tuple[int, int]]:
    return [shape(s) for s in text.split(",") if s.strip()]


def ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers") from None


def floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of numbers") from None


def choices(*known: str):
    """A comma list whose every item is one of ``known``."""
    def parse(text: str) -> list[str]:
        items = [v.strip() for v in text.split(",") if v.strip()]
        unknown = [v for v in items if v not in known]
        if unknown or not items:
            raise argparse.ArgumentTypeError(
                f"unknown {unknown or [text]}; known: {', '.join(known)}")
        return items
    return parse


def add_layer_arguments(parser, *, rounds: int) -> None:
    """The options of the jobs that time one GPTQ layer through QuantLinear on a CPU target:
    --target, --shape, --bits, --group-size, --db, --rounds, --json."""
    parser.add_argument("--target", default="avx2")
    parser.add_argument("--shape", type=shape, default="4096x11008",
                        help="KxN (default 4096x11008)")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--db", default=None, help="tuning database URL")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--json", metavar="PATH")
