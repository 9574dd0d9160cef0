"""Where a Triton kernel spends its time, by Python source line: Nsight Compute's warp-stall
samples per SASS instruction, attributed to lines through the cubin's line table.

    ncu --section SourceCounters ... -o REP python ...           # on the GPU host
    ncu -i REP.ncu-rep --page source --csv --print-source sass > sass.csv
    nvdisasm -g -c ~/.triton/cache/<hash>/<kernel>.cubin > kernel.lines.txt
    python benchmarks/ncu_lines.py sass.csv INDEX kernel.lines.txt [--top 25]

INDEX: which profiled kernel of sass.csv (0 = the first). The cubin must be the one profiled (the
same Triton on the same host: its cache entry). Lines of Triton's own modules (reductions, sort)
are named by file and line only.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
from pathlib import Path


def kernels(sass_csv: Path) -> list[tuple[str, list, list]]:
    """(kernel name, header, rows) of each kernel in ncu's source-page CSV."""
    found, current = [], None
    for row in csv.reader(sass_csv.open()):
        if row and row[0] == "Kernel Name":
            current = [row[1], None, []]
            found.append(current)
        elif row and row[0] == "Address" and current is not None:
            current[1] = row
        elif row and current is not None:
            current[2].append(row)
    return [tuple(k) for k in found]


def line_table(lines_txt: Path) -> dict[int, tuple[str, int]]:
    """SASS offset -> (file, line) from `nvdisasm -g` output (the innermost location)."""
    table, where = {}, None
    for text in lines_txt.open():
        loc = re.search(r'//## File "(.*?)", line (\d+)', text)
        if loc:
            where = (loc.group(1), int(loc.group(2)))
            continue
        at = re.search(r"/\*([0-9a-f]{4,})\*/", text)
        if at and where is not None:
            table[int(at.group(1), 16)] = where
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sass_csv", type=Path)
    parser.add_argument("index", type=int)
    parser.add_argument("lines_txt", type=Path)
    parser.add_argument("--top", type=int, default=25)
    a = parser.parse_args(argv)
    name, header, rows = kernels(a.sass_csv)[a.index]
    samples_at = header.index("Warp Stall Sampling (All Samples)")
    executed_at = header.index("Instructions Executed")
    base = int(rows[0][0], 16)
    table = line_table(a.lines_txt)
    samples, executed, unmapped = collections.Counter(), collections.Counter(), 0
    for row in rows:
        where = table.get(int(row[0], 16) - base)
        if where is None:
            unmapped += 1
            continue
        samples[where] += float(row[samples_at] or 0)
        executed[where] += float(row[executed_at] or 0)
    total = sum(samples.values()) or 1.0
    print(f"{name}: {len(rows)} instructions ({unmapped} without a line), {total:.0f} stall samples")
    sources: dict[str, list[str]] = {}
    for (path, line), count in samples.most_common(a.top):
        if path not in sources:
            sources[path] = Path(path).read_text().splitlines() if Path(path).exists() else []
        text = sources[path][line - 1].strip()[:90] if line <= len(sources[path]) else ""
        print(f"{100 * count / total:5.1f}%  executed {executed[(path, line)]:9.0f}  {Path(path).name}:{line}  {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
