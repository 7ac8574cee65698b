"""``python -m sandboxes.cli``: the same as the ``sandboxes`` console script."""

import sys

from sandboxes.cli import main

sys.exit(main())
