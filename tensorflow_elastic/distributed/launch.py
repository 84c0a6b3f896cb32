"""``python -m tensorflow_elastic.distributed.launch``: the same as ``tfelastic-run``."""

import sys

from tensorflow_elastic.launch.launcher import main

if __name__ == "__main__":
    sys.exit(main())
