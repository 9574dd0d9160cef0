"""Thin entry point: `python -m benchmarks.softmax ARGS` = `anysoftmax bench ARGS`."""

import sys

from anysoftmax.bench.softmax import main

if __name__ == "__main__":
    sys.exit(main())
