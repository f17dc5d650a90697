"""``python -m generator plan|render|bench ...``: see generator/cli.py or ``python -m generator --help``."""
import sys

from .cli import main

sys.exit(main())
