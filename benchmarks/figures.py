"""What the probes' plots share: a figure's title, layout and file."""

from __future__ import annotations

from pathlib import Path


def save(fig, path: Path, title: str, dpi: int = 110) -> Path:
    """`fig` titled `title`, laid out and written to `path` (then closed); `path`."""
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
