"""``python -m gpuspawner.agent``: the same as ``gpuspawner-agent``."""

import sys

from .command import main

sys.exit(main())
