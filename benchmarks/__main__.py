"""``python -m benchmarks``: run every benchmark and write ``benchmarks/results.md``."""

from benchmarks.run import main

raise SystemExit(main())
