"""``python -m gpuspawner.agent``: the same as ``gpuspawner-agent``."""

import sys

from gpuspawner.agent.command import main

sys.exit(main())
