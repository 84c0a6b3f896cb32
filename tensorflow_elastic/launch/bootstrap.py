"""How the agent runs a Python training script: ``python -m tensorflow_elastic.launch.bootstrap SCRIPT ARGS``.

The script runs as ``__main__`` exactly as with ``python SCRIPT``, with two
additions that need no change to it: an uncaught exception leaves an error
file for the agent's root-cause summary, and a crash in native code (a
segfault in a kernel) prints the Python stacks of every thread before the
process dies, so the output tail the agent shows says where it happened.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import sys

from tensorflow_elastic.launch.error_files import install_excepthook


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m tensorflow_elastic.launch.bootstrap SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    # As `python SCRIPT` does: the script's directory comes first on the import path.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    faulthandler.enable(all_threads=True)
    install_excepthook()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
