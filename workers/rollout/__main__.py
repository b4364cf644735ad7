"""`python -m workers.rollout`: the rollout worker process (workers/rollout/worker.py)."""

import sys

from workers.rollout.worker import main

sys.exit(main())
