"""A worker without TensorFlow, for launcher tests that need processes, not training.

It prints its world size from TF_CONFIG (restart-based mode) and the port of the
socket its launcher passed down holding its address (in-process mode), then, by its
flags: raises (a crash with a traceback that names its pid, so no two crashes are the
same; or a setup error, the same in every worker and every start), runs for some seconds, or runs until
a stop file appears; it writes a done file when it ends normally. SIGTERM
makes it print "got SIGTERM" and exit 0 (a graceful leave).
"""

import argparse
import json
import os
import signal
import socket
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--crash", action="store_true")
parser.add_argument("--setup_error", action="store_true")
parser.add_argument("--seconds", type=float, default=0.0)
parser.add_argument("--stop_file")
parser.add_argument("--done_file")
parser.add_argument("--max_seconds", type=float, default=120.0)
args = parser.parse_args()


def on_sigterm(signum, frame):
    print("got SIGTERM", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, on_sigterm)
if args.setup_error:
    raise ValueError("learning_rate must be positive, got -1")
world = len(json.loads(os.environ.get("TF_CONFIG", '{"cluster": {"worker": []}}'))["cluster"]["worker"])
held_port = None
if "TFE_ADDRESS_FD" in os.environ:
    with socket.socket(fileno=int(os.environ["TFE_ADDRESS_FD"])) as held:
        held_port = held.getsockname()[1]
print(json.dumps({"world": world, "node": os.environ.get("TFE_NODE_ID"),
                  "restart_count": os.environ.get("TFE_RESTART_COUNT"),
                  "address": os.environ.get("TFE_ADDRESS"), "held_port": held_port}), flush=True)
if args.crash:
    raise ZeroDivisionError(f"the worker divided by zero on purpose (pid {os.getpid()})")
deadline = time.monotonic() + (args.seconds if args.seconds else args.max_seconds)
while time.monotonic() < deadline:
    if args.stop_file and os.path.exists(args.stop_file):
        break
    time.sleep(0.1)
else:
    if args.stop_file:
        sys.exit(f"stop file {args.stop_file} did not appear in {args.max_seconds} s")
if args.done_file:
    with open(args.done_file, "w") as f:
        f.write("done")
print("finished", flush=True)
