"""Discovery scripts for ``tensorflowrun``: the hosts a cluster manager offers right now.

Each module prints one ``host:slots`` line per available host and is run as
``python -m tensorflow_elastic.launch.discovery.<name> ...``; ``tensorflowrun
--discovery`` takes an executable without arguments, so a two-line wrapper
picks the flags::

    #!/bin/sh
    exec python3 -m tensorflow_elastic.launch.discovery.kubernetes -l app=tfelastic-worker

``kubernetes``: Running and Ready pods by label selector. ``slurm``: the hosts
of the current allocation.
"""
