"""`python -m workers.sp`: a node agent serving rollout requests from the queue (workers/sp/node_serve.py)."""

import sys

from workers.sp.node_serve import main

sys.exit(main())
