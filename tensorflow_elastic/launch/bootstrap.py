"""How the agent runs Python training code: ``python -m tensorflow_elastic.launch.bootstrap SCRIPT ARGS``
(or ``... bootstrap -m MODULE ARGS``).

The script runs as ``__main__`` exactly as with ``python SCRIPT`` (``python -m MODULE``), with two
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
    as_module = sys.argv[1:2] == ["-m"]
    if len(sys.argv) < 2 + as_module:
        sys.exit("usage: python -m tensorflow_elastic.launch.bootstrap [-m MODULE | SCRIPT] "
                 "[ARGS...]")
    target = sys.argv[1 + as_module]
    sys.argv = sys.argv[1 + as_module:]
    # As `python SCRIPT` (`python -m MODULE`) does: the script's directory (the working
    # directory) comes first on the import path.
    sys.path[0] = os.getcwd() if as_module else os.path.dirname(os.path.abspath(target))
    faulthandler.enable(all_threads=True)
    install_excepthook()
    if as_module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
