"""(not implemented yet)"""

from __future__ import annotations

import argparse
import sys


def set_argparser(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> int:
    print("damon-hp attach: not implemented yet", file=sys.stderr)
    return 2
