"""``tfelastic``: inspect elastic runs from the command line.

Subcommands:
  status   members, generation, waiting nodes and recent history of the runs
           an orchestrator serves; with --events_file, the step and steps/s
           (an events file alone is enough); --watch refreshes it in place.
  plot     world size and step rate over time from a job's events file.
  ps-status, ps-configure
           a parameter server's counters; its policy settings, changed while it trains.
"""

from __future__ import annotations

import argparse
import sys
import time

from tensorflow_elastic import environment
from tensorflow_elastic.observability import plot, timeline
from tensorflow_elastic.observability.progress import recent_step_rate
from tensorflow_elastic.ps import cli as ps_cli
from tensorflow_elastic.rendezvous import auth
from tensorflow_elastic.rendezvous.client import Client
from tensorflow_elastic.rendezvous.errors import RendezvousError
from tensorflow_elastic.rendezvous.types import Phase, RunStatus


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfelastic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser(
        "status", help="show the runs of an orchestrator",
        description="Prints, for each run the orchestrator serves (or only --run_id), its "
                    "state, generation, members and waiting nodes with the seconds since each "
                    "was last heard from, blocked addresses and the latest history.")
    status.add_argument("--rdzv_endpoint", metavar="HOST:PORT[,HOST:PORT]",
                        help="the orchestrator's address, or every replica's (the one that "
                        "leads answers; optional with --events_file)")
    status.add_argument("--run_id", help="show only this run")
    status.add_argument("--token_file", help="file holding the orchestrator's shared token "
                        f"(default: ${environment.TOKEN} if set)")
    status.add_argument("--tls_ca", help="PEM certificate to trust when the orchestrator uses TLS")
    status.add_argument("--history", type=int, default=10, metavar="N",
                        help="history entries to show per run (default: %(default)s)")
    status.add_argument("--events_file", default=environment.text(environment.EVENTS_FILE),
                        help="the job's events file, for the step and steps/s "
                             f"(default: ${environment.EVENTS_FILE} if set)")
    status.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="S",
                        help="refresh every S seconds (default 2) until Ctrl-C")
    status.add_argument("--count", type=int, metavar="N",
                        help="with --watch: stop after N refreshes")
    status.set_defaults(func=_status)
    plot.add_parser(commands)
    ps_cli.add_parsers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


def _status(args: argparse.Namespace) -> int:
    if not args.rdzv_endpoint and not args.events_file:
        print("tfelastic status: give --rdzv_endpoint HOST:PORT, --events_file PATH, or both",
              file=sys.stderr)
        return 2
    if args.watch is not None and args.watch <= 0:
        print(f"tfelastic status: --watch must be > 0 seconds, got {args.watch:g}", file=sys.stderr)
        return 2
    try:
        token = auth.load_token(args.token_file)
    except (OSError, ValueError) as e:
        print(f"tfelastic status: {e}", file=sys.stderr)
        return 2
    if args.watch is None:
        text, code = _status_text(args, token)
        print(text, file=sys.stdout if code == 0 else sys.stderr)
        return code
    refreshes = 0
    try:
        while args.count is None or refreshes < args.count:
            if refreshes:
                time.sleep(args.watch)
            text, _ = _status_text(args, token)
            # In a terminal the view is redrawn in place; in a pipe each refresh follows the last.
            header = "\x1b[H\x1b[2J" if sys.stdout.isatty() else "" if not refreshes else "\n"
            print(f"{header}{time.strftime('%H:%M:%S')}  (every {args.watch:g} s, Ctrl-C ends)\n"
                  f"{text}", flush=True)
            refreshes += 1
    except KeyboardInterrupt:
        pass
    return 0


def _status_text(args: argparse.Namespace, token: str | None) -> tuple[str, int]:
    """The status view and its exit code (1: the orchestrator could not be read)."""
    parts = []
    if args.rdzv_endpoint:
        with Client(args.rdzv_endpoint, args.run_id or "", token, tls_ca=args.tls_ca,
                    retry_timeout=5.0) as client:
            try:
                runs = client.status(all_runs=not args.run_id)
            except RendezvousError as e:
                return f"tfelastic status: {args.rdzv_endpoint}: {e.code.name}: {e.message}", 1
        if not runs:
            parts.append(f"no runs on {args.rdzv_endpoint}")
        parts += [format_run(run, args.history) for run in runs]
    if args.events_file:
        if not args.rdzv_endpoint:
            parts.append(format_job(args.events_file))
        parts.append(format_progress(args.events_file))
    return "\n".join(parts), 0


def format_job(events_file: str, failures: int = 3) -> str:
    """The job as its events file tells it: generation, members, the latest failures."""
    try:
        job = timeline.load(events_file)
    except (OSError, ValueError) as e:
        return f"job: cannot read {events_file}: {getattr(e, 'strerror', None) or e}"
    state = "completed" if job.completed else "running"
    lines = [f"job ({events_file}): {state}, generation {job.generation}, world size "
             f"{job.world[-1][1] if job.world else '?'}, members {job.members or '?'}"]
    for incident in job.incidents[-failures:]:
        stamp = time.strftime("%H:%M:%S", time.localtime(incident.time))
        recovery = "not recovered" if incident.recovery_s is None \
            else f"recovered in <= {incident.recovery_s:.2f} s"
        lines.append(f"  failure at {stamp}: nodes {incident.failed or '?'} "
                     f"({incident.cause[:80]}), {recovery}")
    return "\n".join(lines)


def format_progress(events_file: str) -> str:
    """The training progress line of `tfelastic status`, from the job's step events."""
    try:
        progress = recent_step_rate(events_file)
    except OSError as e:
        return f"progress: cannot read {events_file}: {e.strerror}"
    if progress is None:
        return f"progress: no step events in {events_file} yet"
    step, rate = progress
    return f"progress: step {step}" + ("" if rate is None else f", {rate:.2f} steps/s")


def format_run(run: RunStatus, history: int = 10) -> str:
    """A readable table of one run."""
    m = run.membership
    lines = [f"run {run.run_id}: {run.state}, generation {m.generation}, "
             f"{m.world_size} member(s) (min {run.min_nodes}, max {run.max_nodes})"
             + (f", chief {m.chief_id}" if m.members else "")]
    if run.reason:
        lines.append(f"  {'failed' if run.state == Phase.FAILED else 'last change'}: {run.reason}")
    rows = [("NODE", "ROLE", "ADDRESS", "SILENT")]
    rows += [(str(n.node_id), n.role, n.address, f"{n.silent_s:.1f}s") for n in run.nodes]
    lines += ["  " + line for line in _table(rows)]
    for address, failures, remaining in run.blocklist:
        lines.append(f"  blocked: {address} ({failures} failures, {remaining:.0f}s left)")
    if history > 0 and run.history:
        lines.append("  history:")
        for h in run.history[-history:]:
            stamp = time.strftime("%H:%M:%S", time.localtime(h["time"]))
            lines.append(f"    {stamp}  gen {h['generation']:<3} {h['event']:<20} "
                         f"{h['nodes']}  {h['detail']}")
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


if __name__ == "__main__":
    sys.exit(main())
