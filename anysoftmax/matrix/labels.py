"""What the matrix's tables and plots call an entry and a reason: one place that the report
and the plots both read (neither imports the other for it)."""

from __future__ import annotations

import re
from collections import defaultdict

from .cells import SKIPPED, Result

INTERPRETED = " (Triton interpreter)"


def entry_label(cell) -> str:
    """The entry's name as tables show it: a CPU entry's Triton-kernel rows say that the Triton
    interpreter runs them (a backend that `needs_interpreter` runs CPU tensors no other way);
    its torch rows do not."""
    if "interpreter" in cell.entry.lower() or not str(cell.device).startswith("cpu"):
        return cell.entry
    from ..core import registry

    backend = registry.registered().get(cell.backend)
    return cell.entry + INTERPRETED if backend is not None and hasattr(backend, "needs_interpreter") else cell.entry


# A refusal names the request it refused ("does not support softmax(shape=[2, 5], ...)"); the
# cell already says which request it was, so the same refusal of many requests is one reason.
_REQUEST = re.compile(r"\b(?:log_)?softmax\((?:shape=)[^()]*\)")


def reason_key(r: Result) -> str:
    """The cell's reason, whole, with the request it names replaced by "this request": the
    key that groups identical refusals of different cells."""
    return _REQUEST.sub("this request", r.reason.strip())


def grouped_reasons(results: list[Result], missing: dict) -> list[tuple[int, str, str]]:
    """(cells, "entry (backends)", reason) of the skipped cells, most cells first: what the
    status map writes under its grey squares."""
    groups: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for r in results:
        if r.status == SKIPPED:
            groups[(r.cell.entry, missing.get(r.cell.entry) or reason_key(r))].append(r)
    out = [(len(rs), f"{entry} ({', '.join(dict.fromkeys(r.cell.backend for r in rs))})", why)
           for (entry, why), rs in groups.items()]
    return sorted(out, key=lambda t: -t[0])
