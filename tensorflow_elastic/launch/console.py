"""What of a worker's output reaches the console: TensorFlow's own log lines stay in its log file.

A recovery makes TensorFlow's C++ runtime log the collectives it aborts (about
30 lines per survivor, one of them "Restart your program to reset", which is
not true here), and every re-form logs absl's warning about enabling collective
ops after start-up. The workers' own lines (and the runtime's one line per
recovery) are what a user needs; the raw lines stay in each worker's log file
and on the console with ``tfelastic-run --verbose``. A fatal C++ line and any
Python traceback always reach the console.
"""

from __future__ import annotations

import re

# A line of TensorFlow's C++ logging below FATAL: "E0000 00:00:1795480200.820397   18202 file.cc:252] ..."
# (absl format) or "2026-11-23 10:00:00.123456: W tensorflow/...cc:12] ..." (TensorFlow's own).
_NATIVE_LOG = re.compile(r"^(?:[IWE]\d{4} [\d:.]+\s+\d+ \S+:\d+\]"
                         r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] \S+:\d+\])")
# Lines that continue a native log record (gRPC error details of an aborted collective).
_CONTINUATION = re.compile(r"^(?:Additional GRPC error information from remote target"
                           r"|:?UNKNOWN:|:\{|\s*\[\[|\s*The error could be from a previous operation"
                           r"|\s*\{\{function_node)")
_KNOWN_NOTICES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "WARNING:absl:Enabling collective ops after program startup",
)


class ConsoleFilter:
    """Decides, line by line, whether a worker's output line is shown (one per output stream)."""

    def __init__(self, verbose: bool = False):
        self.verbose = verbose
        self._in_native_record = False

    def shows(self, line: str) -> bool:
        if self.verbose:
            return True
        if _NATIVE_LOG.match(line):
            self._in_native_record = True
            return False
        if self._in_native_record and _CONTINUATION.match(line):
            return False
        self._in_native_record = False
        return not line.startswith(_KNOWN_NOTICES)
