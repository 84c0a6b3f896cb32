"""Every environment variable the launcher, the orchestrator and the workers read, in one place.

The launcher's agent sets most of them for its workers; a user may set them by
hand to run a script without the launcher. Importing this module is free: it
only names things.
"""

from __future__ import annotations

import math
import os

# ---- a worker's place in the job (set by the agent for every worker)
ENDPOINT = "TFE_RDZV_ENDPOINT"          # the orchestrator, HOST:PORT[,HOST:PORT...] (replicas)
RUN_ID = "TFE_RUN_ID"                   # the job's name at the orchestrator
TOKEN = "TFE_RDZV_TOKEN"                # the orchestrator's shared secret
TLS_CA = "TFE_RDZV_TLS_CA"              # PEM certificate to trust when the orchestrator uses TLS
ETCD_PASSWORD = "TFE_ETCD_PASSWORD"     # the orchestrator's etcd user's password (--etcd_user)
ADDRESS = "TFE_ADDRESS"                 # this worker's TensorFlow server, HOST:PORT
ADDRESS_FD = "TFE_ADDRESS_FD"           # a listening socket holding ADDRESS's port
MIN_NODES = "TFE_MIN_NODES"
MAX_NODES = "TFE_MAX_NODES"
JOIN_TIMEOUT = "TFE_JOIN_TIMEOUT"       # seconds a node waits to become a member
LOCAL_RANK = "TFE_LOCAL_RANK"           # the worker's slot in its agent
RESTART_COUNT = "TFE_RESTART_COUNT"     # how often the agent restarted its workers
NODE_ID = "TFE_NODE_ID"                 # restart mode: the worker's permanent id
GENERATION = "TFE_GENERATION"           # restart mode: the generation it starts in
NODE_FILE = "TFE_NODE_FILE"             # in-process mode: where the worker tells its agent its id
ERROR_FILE = "TFE_ERROR_FILE"           # where a failing worker writes its exception
SPARE_FD = "TFE_SPARE_FD"               # a spare: the pipe its agent says "join now" on
DEATH_NOTICE_FD = "TFE_DEATH_NOTICE_FD"  # the mutex a worker holds so its agent knows of its death at once

# ---- what a worker reports and how patient it is
EVENTS_FILE = "TFE_EVENTS_FILE"         # the shared JSON-lines record of what happened
STEP_EVENTS_EVERY = "TFE_STEP_EVENTS_EVERY"
PROGRESS_TIMEOUT = "TFE_PROGRESS_TIMEOUT"   # seconds without a commit before the watchdog acts
BARRIER_TIMEOUT = "TFE_BARRIER_TIMEOUT"     # seconds members wait for each other at a barrier
HEARTBEAT_INTERVAL = "TFE_HEARTBEAT_INTERVAL"  # seconds between two heartbeats of a node
# Seconds a step may wait inside TensorFlow without a commit before the worker probes its peers.
PEER_CHECK_AFTER = "TFE_PEER_CHECK_AFTER"
# Seconds a worker keeps calling an orchestrator that does not answer (restarting, failing
# over to another replica) before a re-form gives up; a finished training returns anyway.
ORCHESTRATOR_WAIT = "TFE_ORCHESTRATOR_WAIT"
# Seconds a worker's interpreter may take to exit before it dumps its threads' stacks and ends.
EXIT_TIMEOUT = "TFE_EXIT_TIMEOUT"

# ---- input
TFRECORD_INDEX_DIR = "TFE_TFRECORD_INDEX_DIR"  # where TFRecord indexes are kept between processes

# ---- parameter-server mode
PS_ROLE = "TFE_PS_ROLE"                 # "ps" or "worker"
PS_ADDRESS = "TFE_PS_ADDRESS"
PS_CHECKPOINT_DIR = "TFE_PS_CHECKPOINT_DIR"

# ---- building and the op library
OPS_LIBRARY = "TFE_OPS_LIBRARY"         # setup.py: a prebuilt op library to package (else it compiles one)
# "0": the library's AssignAdd/AssignSub kernels copy a shared buffer before updating it, as
# TensorFlow's do, instead of writing the result once (read by cc/kernels/, once per process).
ONE_PASS_UPDATES = "TFE_ONE_PASS_UPDATES"


def text(name: str, default: str | None = None) -> str | None:
    """The variable's value; an empty one counts as unset."""
    return os.environ.get(name) or default


def number(name: str, default: float) -> float:
    """The variable as a float, with an error that names it when it is not one."""
    return _parsed(name, default, float, "a number")


def duration(name: str, default: float) -> float:
    """The variable as a number of seconds (finite, above 0), with an error that names it."""
    value = number(name, default)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"${name}={os.environ.get(name)!r} must be a number of seconds above 0")
    return value


def integer(name: str, default: int) -> int:
    """The variable as an int, with an error that names it when it is not one."""
    return _parsed(name, default, int, "a whole number")


def _parsed(name: str, default, convert, kind: str):
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return convert(value)
    except ValueError:
        raise ValueError(f"${name}={value!r} is not {kind}") from None


def pop(name: str) -> str | None:
    """Removes the variable, so this process's children do not inherit it; returns its value."""
    return os.environ.pop(name, None)
