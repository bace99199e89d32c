"""python -m dptrain: the command line (see dptrain.cli)."""

import sys

from .cli import main

sys.exit(main())
