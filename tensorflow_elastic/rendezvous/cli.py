"""``tfelastic-orchestrator``: runs the membership service of elastic runs on its own."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading

from tensorflow_elastic import environment, net
from tensorflow_elastic.observability import prometheus
from tensorflow_elastic.rendezvous import auth
from tensorflow_elastic.rendezvous.etcd import EtcdAccess, parse_url
from tensorflow_elastic.rendezvous.leader import DEFAULT_TTL_S
from tensorflow_elastic.rendezvous.server import Orchestrator, check_advertise
from tensorflow_elastic.rendezvous.settings import RunSettings

DEFAULT_PORT = 29400
# Allocations between two young collections of the command's process (Python's default: 700).
# Each young collection promotes what is alive then (the calls in flight, the streams), and
# every ten promotions a collection of the oldest generation scans all that the process holds:
# at 10,000 nodes 0.3-0.5 s of the serving loop each, several times a second's worth during a
# formation, and one in the middle of a re-form. Fewer young collections promote far fewer
# objects that would have died anyway, so the full scans come as much less often.
GC_YOUNG_THRESHOLD = 20_000

_DESCRIPTION = """\
Serves the membership of elastic runs: nodes join and get permanent ids and
numbered generations of members; heartbeats find silent nodes; barriers and
small exchanges help members start a generation. Prints `listening on
HOST:PORT` once ready. Point every node at it with --rdzv_endpoint HOST:PORT.
"""

_EPILOG = """\
State: with --state_dir, membership is saved on every change, so the
orchestrator can be killed and restarted on the same port and the runs go on.
Security: it listens on 127.0.0.1 unless --host says otherwise, and refuses
any other address without a token (--insecure overrides). With --token_file
(or $TFE_RDZV_TOKEN) every call must carry the token; with --tls_cert/--tls_key
the traffic (and so the token) is encrypted: give workers the CA with
tfelastic-run --tls_ca. Metrics are served on 127.0.0.1 unless --metrics_host
says otherwise. See docs/orchestrator.md.
"""

# Flags named after the RunSettings field they set (type and default come from there).
_SETTING_FLAGS = {
    "heartbeat_timeout": "seconds without a heartbeat before a node is declared failed and the "
                         "next generation forms; the bound on detecting a host that vanished "
                         "(workers heartbeat every 0.25 s, $TFE_HEARTBEAT_INTERVAL; see "
                         "docs/failures.md)",
    "last_call": "seconds to wait for more nodes once min_nodes have joined, before the "
                 "generation forms; max_nodes forms at once",
    "below_min_timeout": "seconds a run below min_nodes after failures waits for nodes to come "
                         "back before it fails for every member",
    "probe_timeout": "seconds to try to connect to a reported peer's address before it is "
                     "confirmed failed",
    "watch_loss_grace": "seconds a member whose watch stream broke (its process died, most "
                        "likely) may stay silent before it is declared failed, instead of "
                        "--heartbeat_timeout; keep it above the members' heartbeat interval",
    "blocklist_after": "failures of one address before it is blocked",
    "blocklist_cooldown": "seconds the first block lasts; each further failure doubles it",
    "blocklist_max_cooldown": "longest block in seconds",
    "max_value_bytes": "largest value a node may put with Synchronize",
    "run_expiry": "seconds a run with no live node (completed, failed or emptied) is kept "
                  "before it is deleted",
    "max_runs": "runs this orchestrator serves at once; a new one beyond is refused",
    "max_watches_per_peer": "watch streams one host may hold open",
    "max_watches": "watch streams all hosts together may hold open",
    "max_gathers": "barriers and exchanges one generation may hold",
}
_POSITIVE_FLAGS = ("heartbeat_timeout", "below_min_timeout", "probe_timeout", "watch_loss_grace",
                   "blocklist_cooldown", "blocklist_max_cooldown", "run_expiry", "max_runs",
                   "max_watches_per_peer", "max_watches", "blocklist_after", "max_value_bytes",
                   "max_gathers")


def build_parser() -> argparse.ArgumentParser:
    defaults = RunSettings()
    p = argparse.ArgumentParser(prog="tfelastic-orchestrator", description=_DESCRIPTION,
                                epilog=_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: %(default)s, this machine only; "
                   "0.0.0.0 for every interface, which needs a token or --insecure)")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --host without a token (a network you trust)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help="port to listen on; 0 picks a free one (default: %(default)s)")
    p.add_argument("--state_dir", help="directory to keep run state in across restarts "
                   "(default: memory only)")
    p.add_argument("--store", help="etcd://HOST:PORT[,HOST:PORT][/PREFIX]: keep run state in etcd "
                   "and run as one of several replicas (one leads, the others stand by and take "
                   "over when it is lost); etcds://... for etcd over TLS; give clients every "
                   "replica: --rdzv_endpoint H1:P1,H2:P2. See docs/ha.md")
    p.add_argument("--advertise", help="HOST:PORT clients reach this replica at, told to them by "
                   "the replicas that stand by; it must be one of the clients' --rdzv_endpoint "
                   "(default: --host:--port; required with --host 0.0.0.0)")
    p.add_argument("--etcd_ca", help="PEM certificate(s) to trust for etcd's TLS (etcds://; "
                   "default: the system's)")
    p.add_argument("--etcd_cert", help="PEM client certificate for etcd's client certificate "
                   "check (etcds://; needs --etcd_key)")
    p.add_argument("--etcd_key", help="PEM private key of --etcd_cert")
    p.add_argument("--etcd_user", help="etcd user to authenticate as (etcd auth enabled); its "
                   f"password from --etcd_password_file or ${environment.ETCD_PASSWORD}")
    p.add_argument("--etcd_password_file", help="file whose first line is --etcd_user's "
                   "password")
    p.add_argument("--leader_ttl", type=int, default=DEFAULT_TTL_S,
                   help="seconds of the leader's etcd lease: a lost leader is replaced within "
                   "about this long (etcd raises it to its minimum; default: %(default)s)")
    p.add_argument("--token_file", help="file whose first line is the shared token every call "
                   f"must carry (default: ${environment.TOKEN} if set, else no token)")
    p.add_argument("--tls_cert", help="PEM certificate chain; enables TLS (needs --tls_key)")
    p.add_argument("--tls_key", help="PEM private key of --tls_cert")
    for field, text in _SETTING_FLAGS.items():
        default = getattr(defaults, field)
        p.add_argument(f"--{field}", type=type(default), default=default,
                       help=f"{text} (default: %(default)s)")
    prometheus.add_flags(p, "membership, generations, rendezvous durations, RPCs")
    p.add_argument("--events_file", help=f"append events (JSON lines) here (default: "
                   f"${environment.EVENTS_FILE} if set)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls_cert and --tls_key go together")
    for flag in _POSITIVE_FLAGS:
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag} must be > 0")
    if args.last_call < 0:
        parser.error("--last_call must be >= 0")
    if args.store is not None:
        if args.state_dir is not None:
            parser.error("--store and --state_dir exclude each other: the state lives in etcd")
        try:
            parse_url(args.store)
        except ValueError as e:
            parser.error(str(e))
        if args.leader_ttl < 1:
            parser.error("--leader_ttl must be a whole number of seconds >= 1")
        try:
            check_advertise(args.host, args.advertise)
        except ValueError as e:
            parser.error(str(e))
    try:
        store_access = _store_access(args)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    try:
        token = auth.load_token(args.token_file)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    refusal = auth.exposure_error(args.host, token, args.insecure)
    if refusal:
        parser.error(refusal)
    settings = RunSettings(**{field: getattr(args, field) for field in _SETTING_FLAGS})
    collect_for_serving()
    server = Orchestrator(args.host, args.port, state_dir=args.state_dir, token=token,
                          tls_cert=args.tls_cert, tls_key=args.tls_key,
                          metrics_port=args.metrics_port, metrics_host=args.metrics_host,
                          events_file=args.events_file, settings=settings, store=args.store,
                          advertise=args.advertise, leader_ttl=args.leader_ttl,
                          store_access=store_access)
    try:
        server.start()
    except OSError as e:
        print(f"tfelastic-orchestrator: {e}", file=sys.stderr)
        return 1
    if token is None and not net.is_loopback(args.host):
        print(f"warning: no token and listening on {args.host}: anyone who reaches the port can "
              f"change membership; use --token_file", file=sys.stderr, flush=True)
    if server.metrics_port is not None:
        print(f"metrics on {prometheus.url(args.metrics_host, server.metrics_port)}", flush=True)
    print(f"listening on {server.endpoint}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        if not server.running:
            print("tfelastic-orchestrator: the server stopped unexpectedly", file=sys.stderr)
            return 1
    server.stop()
    return 0



def collect_for_serving() -> None:
    """Sets this process's garbage collection for a long-lived server of many streams: what
    start-up loaded (modules, flags) is frozen out of every later scan, and young collections
    run every GC_YOUNG_THRESHOLD allocations."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


def _store_access(args: argparse.Namespace) -> EtcdAccess:
    """The etcd TLS files and user of the flags; ValueError for flags that do not fit."""
    tls_files = (args.etcd_ca, args.etcd_cert, args.etcd_key)
    user_flags = args.etcd_user is not None or args.etcd_password_file is not None
    if args.store is None:
        if any(tls_files) or user_flags:
            raise ValueError("the --etcd_* flags need an etcd store (--store)")
        return EtcdAccess()
    if any(tls_files) and not parse_url(args.store).tls:
        raise ValueError("--etcd_ca/--etcd_cert/--etcd_key need TLS: --store etcds://...")
    if (args.etcd_cert is None) != (args.etcd_key is None):
        raise ValueError("--etcd_cert and --etcd_key go together")
    for path in tls_files:
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{path}: no such file")
    password = None
    if args.etcd_user is not None:
        password = auth.load_token(args.etcd_password_file, env=environment.ETCD_PASSWORD)
        if password is None:
            raise ValueError(f"--etcd_user needs its password: --etcd_password_file or "
                             f"${environment.ETCD_PASSWORD}")
    elif args.etcd_password_file is not None:
        raise ValueError("--etcd_password_file needs --etcd_user")
    return EtcdAccess(args.etcd_ca, args.etcd_cert, args.etcd_key, args.etcd_user, password)
