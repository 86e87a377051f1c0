"""``python -m features.cli``: the ``features`` command."""

import sys

from features.cli import main

sys.exit(main())
