"""Where configuration lives: the repository's `configs/` folder, or $ANYSOFTMAX_CONFIG_DIR."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import yaml


def config_dir() -> Path:
    """The folder holding device matrices and tuning tables."""
    env = os.environ.get("ANYSOFTMAX_CONFIG_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "configs"


@lru_cache(maxsize=None)
def load_tuning(name: str) -> dict:
    """The tuning table `configs/tuning/<name>.yaml` as a dict (cached; read once)."""
    path = config_dir() / "tuning" / f"{name}.yaml"
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"tuning table {path} not found: install anysoftmax from its repository "
            f"(pip install -e .) or set ANYSOFTMAX_CONFIG_DIR to a copy of its configs/ folder") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data
