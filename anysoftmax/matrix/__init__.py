"""Device-matrix runs: a YAML file of devices × backends × shapes × dtypes × dims × ops, each cell
checked against the float64 reference and optionally benchmarked (`anysoftmax matrix`).

Modules, one job each: `schema` (read and validate the YAML), `cells` (expand it into cells;
result records), `devices` (find the devices on this machine), `providers` (what a cell runs:
a backend, `auto`, or a peer such as `peer:torch`), `conformance` (forward and backward
checks), `execute` (one cell, conformance then benchmark), `workers` (worker
processes, one per GPU), `runner` (a whole run), `report` and `plots` (terminal, JSON, CSV,
Markdown, PNG).
"""

from .cells import FAILED, PASSED, SKIPPED, Cell, Result, expand
from .runner import MatrixRun, failed, run_matrix
from .schema import ConfigError, MatrixConfig, load_config, validate

__all__ = [
    "FAILED", "PASSED", "SKIPPED", "Cell", "ConfigError", "MatrixConfig", "MatrixRun", "Result", "expand", "failed",
    "load_config", "run_matrix", "validate",
]
