"""``python -m generator plan|render|bench ...``: see generator/cli/ or ``python -m generator --help``."""
import sys

from .cli import main

sys.exit(main())
