"""`python -m anysoftmax ...`: the same command line as `anysoftmax ...`."""

from .cli import main

raise SystemExit(main())
