"""``python -m tensorflow_elastic.rendezvous`` runs the orchestrator."""

import sys

from tensorflow_elastic.rendezvous.cli import main

sys.exit(main())
