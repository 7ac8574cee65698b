"""``python -m agent "TASK" --model provider:model [--sandbox local|docker|URL] [--thread ID]``."""

import sys

from agent.cli import main

sys.exit(main())
