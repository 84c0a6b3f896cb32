"""A PS-role process without TensorFlow: it prints where it listens, records parameter versions
as a parameter server does (events of source ``ps`` with its live PS workers), then ends with
the exit code given as its argument."""

import os
import sys
import time

from tensorflow_elastic.observability import events
from tensorflow_elastic.observability.progress import PS_SOURCE

log = events.EventLog(source=PS_SOURCE)
print(f"listening on {os.environ['TFE_PS_ADDRESS']}", flush=True)
for version in (10, 20, 30, 40):
    log.record(events.STEP, version=version, step=version, loss=1.0, workers=3)
    time.sleep(0.3)
sys.exit(int(sys.argv[1]))
