"""``python -m generator.cli ...``: the same as ``python -m generator ...``."""
import sys

from . import main

sys.exit(main())
