"""``tfelastic ps-status`` and ``tfelastic ps-configure``: look at and steer a running PS."""

from __future__ import annotations

import argparse
import json
import sys

from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.ps.client import PSClient
from tensorflow_elastic.ps.errors import PSError
from tensorflow_elastic.rendezvous import auth

# Every setting Configure takes, so a new field in the proto reaches the CLI by itself.
SETTINGS = tuple(f.name for f in pb.ConfigureRequest.DESCRIPTOR.fields if f.name != "run_id")


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds the PS subcommands to the `tfelastic` command."""
    status = commands.add_parser(
        "ps-status", help="show a parameter server's version, workers and counters",
        description="Prints the version, policy, live workers, accepted and rejected gradients "
                    "(by reason) and the staleness of applied gradients of a running PS.")
    status.add_argument("--ps_address", required=True, metavar="HOST:PORT")
    status.add_argument("--run_id", default="default", help="the run id (default: %(default)s)")
    status.add_argument("--json", action="store_true", help="print the raw counters as JSON")
    _add_security_arguments(status)
    status.set_defaults(func=_status)
    configure = commands.add_parser(
        "ps-configure", help="change a parameter server's policy settings while it trains",
        description="Sends new settings to a running PS; it validates them (a bad combination "
                    "is refused and nothing changes) and adopts them at its next iteration. "
                    "Prints the settings in force.")
    configure.add_argument("--ps_address", required=True, metavar="HOST:PORT")
    configure.add_argument("--run_id", default="default", help="the run id (default: %(default)s)")
    for setting in SETTINGS:
        configure.add_argument(f"--{setting}", type=int, metavar="N")
    _add_security_arguments(configure)
    configure.set_defaults(func=_configure)


def _add_security_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token_file", help="file whose first line is the PS's shared token "
                                             "(default: $TFE_RDZV_TOKEN)")
    parser.add_argument("--tls_ca", help="PEM certificate to trust when the PS uses TLS")


def _client(args: argparse.Namespace) -> PSClient:
    return PSClient(args.ps_address, args.run_id, call_timeout=10.0, reconnect_timeout=5.0,
                    token=auth.load_token(args.token_file), tls_ca_file=args.tls_ca)


def _status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        try:
            status = client.status()
        except PSError as e:
            print(f"tfelastic ps-status: {args.ps_address}: {e}", file=sys.stderr)
            return 1
    stats = json.loads(status.stats_json)
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    staleness = stats.get("staleness", {})
    print(f"run {args.run_id}: version {status.version}, policy {status.policy}, "
          f"{len(status.workers)} live worker(s) {list(status.workers)}"
          + (f", stopping ({status.stop_reason})" if status.stop else ""))
    print(f"  accepted {stats.get('accepted')}, rejected {stats.get('rejected_total')} "
          f"{ {k: v for k, v in stats.get('rejected', {}).items() if v} }, "
          f"bad requests {stats.get('bad_requests', {})}")
    print(f"  staleness median {staleness.get('median')}, p95 {staleness.get('p95')}, "
          f"max {staleness.get('max')}; last loss {stats.get('last_loss')}")
    return 0


def _configure(args: argparse.Namespace) -> int:
    changes = {s: getattr(args, s) for s in SETTINGS if getattr(args, s) is not None}
    if not changes:
        print("tfelastic ps-configure: give at least one of "
              + ", ".join(f"--{s}" for s in SETTINGS), file=sys.stderr)
        return 2
    with _client(args) as client:
        try:
            reply = client.configure(**changes)
        except PSError as e:
            print(f"tfelastic ps-configure: {e}", file=sys.stderr)
            return 1
    print(reply.config_json)
    return 0
