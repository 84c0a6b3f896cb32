"""Prints the hosts of the current Slurm allocation, as ``host:slots`` lines.

    python -m tensorflow_elastic.launch.discovery.slurm [--slots N] [--nodelist LIST]

Run inside an allocation (sbatch, salloc): the hosts come from
``scontrol show hostnames "$SLURM_JOB_NODELIST"``, the slots from --slots or
else $SLURM_NTASKS_PER_NODE (set by ``--ntasks-per-node``), else 1. Exits 1
with a message on stderr outside an allocation, when scontrol is missing or
fails, or when it names no host.
"""

from __future__ import annotations

import argparse
import os
import sys

from tensorflow_elastic.launch.discovery.command import DiscoveryError, run_main, run_tool, slot_count

PROG = "python -m tensorflow_elastic.launch.discovery.slurm"
NODELIST = "SLURM_JOB_NODELIST"
NTASKS_PER_NODE = "SLURM_NTASKS_PER_NODE"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slots", type=slot_count,
                   help=f"worker processes per host (default: ${NTASKS_PER_NODE}, else 1)")
    p.add_argument("--nodelist", default=os.environ.get(NODELIST),
                   help=f"Slurm host list, e.g. node[01-04] (default: ${NODELIST})")
    p.add_argument("--scontrol", default="scontrol", help="the scontrol to run (default: %(default)s)")
    return p


def slots_from_environment() -> int:
    value = os.environ.get(NTASKS_PER_NODE)
    if not value:
        return 1
    try:
        return slot_count(value)
    except argparse.ArgumentTypeError as e:
        raise DiscoveryError(f"${NTASKS_PER_NODE}={value!r}: {e}; give --slots") from None


def find_hosts(args: argparse.Namespace) -> list[str]:
    if not args.nodelist:
        raise DiscoveryError(f"${NODELIST} is not set: run inside a Slurm allocation "
                             f"(sbatch, salloc) or give --nodelist")
    output = run_tool([args.scontrol, "show", "hostnames", args.nodelist])
    hosts = [line.strip() for line in output.splitlines() if line.strip()]
    bad = [h for h in hosts if any(c.isspace() or c == ":" for c in h)]
    if bad:
        raise DiscoveryError(f"scontrol printed {bad[0]!r}, which is not a host name")
    if not hosts:
        raise DiscoveryError(f"scontrol names no host in {args.nodelist!r}")
    return hosts


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        slots = args.slots or slots_from_environment()
    except DiscoveryError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return 1
    return run_main(PROG, lambda: find_hosts(args), slots)


if __name__ == "__main__":
    sys.exit(main())
