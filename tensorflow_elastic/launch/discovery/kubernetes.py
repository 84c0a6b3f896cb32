"""Prints the Running and Ready pods that match a label selector, as ``podIP:slots`` lines.

    python -m tensorflow_elastic.launch.discovery.kubernetes -l app=tfelastic-worker [-n NS] [--slots N]

Pods are addressed by IP: a pod's name resolves only through a headless
Service, its IP always. A pod that is not Running, not Ready, has no IP yet
or is being deleted is left out, so ``tensorflowrun`` starts agents only where
one can run and stops the agent of a pod on its way out. Needs ``kubectl``
with permission to list pods in the namespace (``deploy/kubernetes/discovery-rbac.yaml``).
Exits 1 with a message on stderr when kubectl is missing or fails, its output
is not understood, or no pod qualifies.
"""

from __future__ import annotations

import argparse
import sys

from tensorflow_elastic.launch.discovery.command import DiscoveryError, run_main, run_tool, slot_count

PROG = "python -m tensorflow_elastic.launch.discovery.kubernetes"
# One tab-separated line per pod: name, IP, phase, Ready condition, deletion time (empty if none).
POD_FIELDS = ('{range .items[*]}{.metadata.name}{"\\t"}{.status.podIP}{"\\t"}{.status.phase}'
              '{"\\t"}{.status.conditions[?(@.type=="Ready")].status}'
              '{"\\t"}{.metadata.deletionTimestamp}{"\\n"}{end}')


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-l", "--selector", required=True,
                   help="label selector of the worker pods, e.g. app=tfelastic-worker")
    p.add_argument("-n", "--namespace", help="the pods' namespace (default: kubectl's current one)")
    p.add_argument("--slots", type=slot_count, default=1,
                   help="worker processes per pod (default: %(default)s)")
    p.add_argument("--kubectl", default="kubectl", help="the kubectl to run (default: %(default)s)")
    return p


def kubectl_command(args: argparse.Namespace) -> list[str]:
    command = [args.kubectl, "get", "pods", "--selector", args.selector,
               "--output", f"jsonpath={POD_FIELDS}"]
    if args.namespace:
        command += ["--namespace", args.namespace]
    return command


def ready_pod_ips(output: str) -> list[str]:
    """The IPs of the usable pods in kubectl's output (see POD_FIELDS), sorted."""
    ips = []
    for number, line in enumerate(output.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 5:
            raise DiscoveryError(f"kubectl output, line {number}: expected 5 tab-separated "
                                 f"fields (name, IP, phase, ready, deletion), got {line!r}")
        _, ip, phase, ready, deleting = fields
        if ip and phase == "Running" and ready == "True" and not deleting:
            ips.append(ip)
    return sorted(ips)


def find_hosts(args: argparse.Namespace) -> list[str]:
    ips = ready_pod_ips(run_tool(kubectl_command(args)))
    if not ips:
        where = f" in namespace {args.namespace}" if args.namespace else ""
        raise DiscoveryError(f"no Running and Ready pod matches {args.selector!r}{where}")
    return ips


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_main(PROG, lambda: find_hosts(args), args.slots)


if __name__ == "__main__":
    sys.exit(main())
