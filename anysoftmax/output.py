"""Consoles for terminals and logs alike (the CLI's and the matrix's tables).

A log has no width: rich would squeeze tables into 80 columns and cut names to `trit…`. So the
console is as wide as $COLUMNS, else the terminal, else `WIDE` columns; and a table is never
printed narrower than its names need: in a narrower terminal its long lines wrap, nothing is cut.
"""

from __future__ import annotations

import os

WIDE = 200  # columns when the output is a file or a pipe


def console_width(is_terminal: bool, environ=None) -> int | None:
    """$COLUMNS when set, else the terminal's own width (None: rich asks the terminal), else
    WIDE."""
    columns = (os.environ if environ is None else environ).get("COLUMNS", "")
    if columns.strip().isdigit() and int(columns) > 0:
        return int(columns)
    return None if is_terminal else WIDE


def make_console(stderr: bool = False):
    """A rich Console on stdout (stderr) with the width above."""
    from rich.console import Console

    probe = Console(stderr=stderr)
    return Console(width=console_width(probe.is_terminal), stderr=stderr)


def print_table(console, table) -> None:
    """Print `table` at least as wide as its columns' minimum widths (names are no-wrap columns
    with a minimum width: they stay whole), without cropping."""
    from rich.measure import Measurement

    need = Measurement.get(console, console.options.update(max_width=10**5), table).minimum
    width = console.width
    console.width = max(width, need)
    try:
        console.print(table, crop=False)
    finally:
        console.width = width
