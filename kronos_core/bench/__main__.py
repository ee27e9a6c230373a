"""`python -m kronos_core.bench predict ...` and `python -m kronos_core.bench load ...` (see bench/predict.py)."""

import sys

from kronos_core.bench.predict import main

sys.exit(main())
