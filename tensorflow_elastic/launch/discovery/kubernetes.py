"""Prints the Running and Ready pods that match a label selector, as ``podIP:slots`` lines.

    python -m tensorflow_elastic.launch.discovery.kubernetes -l app=tfelastic-worker [-n NS] [--slots N]

Pods are addressed by IP: a pod's name resolves only through a headless
Service, its IP always. A pod that is not Running, not Ready, has no IP yet
or is being deleted is left out, so ``tensorflowrun`` starts agents only where
one can run and stops the agent of a pod on its way out. Inside a pod it asks
the Kubernetes API with the pod's service account (no kubectl needed); outside
one, ``kubectl``. Either needs permission to list pods in the namespace
(``deploy/kubernetes/discovery-rbac.yaml``). Exits 1 with a message on stderr
when the API or kubectl is missing or fails, the answer is not understood, or
no pod qualifies.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tensorflow_elastic.launch.discovery import kubernetes_api
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
    p.add_argument("--kubectl", default="kubectl",
                   help="the kubectl to run outside a pod (default: %(default)s)")
    p.add_argument("--service_account_dir", default=kubernetes_api.SERVICE_ACCOUNT_DIR,
                   help="inside a pod: the service account's token, ca.crt and namespace "
                   "(default: %(default)s)")
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
        if usable(ip, phase, ready, deleting):
            ips.append(ip)
    return sorted(ips)


def usable(ip: str, phase: str, ready: str, deleting: str) -> bool:
    """Whether a pod can run an agent now: it has an IP, runs, is Ready, is not on its way out."""
    return bool(ip) and phase == "Running" and ready == "True" and not deleting


def api_pod_ips(pods: list[dict[str, Any]]) -> list[str]:
    """The IPs of the usable pods among the API's Pod objects, sorted."""
    ips = []
    for pod in pods:
        status = pod.get("status") or {}
        ready = next((c.get("status", "") for c in status.get("conditions") or []
                      if c.get("type") == "Ready"), "")
        deleting = (pod.get("metadata") or {}).get("deletionTimestamp") or ""
        if usable(status.get("podIP") or "", status.get("phase") or "", ready, deleting):
            ips.append(status["podIP"])
    return sorted(ips)


def find_hosts(args: argparse.Namespace) -> list[str]:
    config = kubernetes_api.in_cluster(os.environ, args.service_account_dir)
    if config is not None:
        ips = api_pod_ips(kubernetes_api.list_pods(config, args.selector, args.namespace))
    else:
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
