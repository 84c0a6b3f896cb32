"""Chaos benchmark: N faults at random points of a realistic elastic loop, and what each one cost.

One job: `tfelastic-run --standalone --nworkers 2:3 --nproc_per_node 3
--max_restarts <large>` runs benchmarks/chaos_worker.py with one of the loops
of benchmarks/chaos_workloads.py (--workload: a custom loop with one
collective a step and --compute_ms of CPU work between steps; one with three
collectives a step and Python between steps; Keras `fit`; a CNN with
BatchNorm and dropout under `fit`), a commit every step. Killed workers come
back through the launcher as new nodes. Faults, in a seeded
random order:

* kill_step / kill_chief_step: SIGKILL of a member (or the chief) at a random
  offset within a step;
* kill_commit: a member (the chief half the time) SIGKILLs itself in a commit;
* kill_sync_join: a member SIGKILLs itself in the state sync that admits a
  newcomer;
* kill_chief_join: SIGKILL of the chief as soon as a newcomer asks to join;
* stall (--stalls of the faults): SIGSTOP of a member for the heartbeat timeout
  plus 2 s, then SIGCONT (the orchestrator has removed it by then: it comes
  back as a new node, in its running process);
* a vanished host (link down) needs network namespaces per worker, which a
  single launcher does not give: reported as null.

With --slow, no false removals: after the faults a healthy member spins in
Python for 1.5x the heartbeat timeout, then two other processes keep both
cores busy as long; every failure detected meanwhile is a false removal.
With --soak, a soak instead (see --help).

Measured per fault from the events file and the workers' step lines (Unix
times): detection (the fault -> the first failure_detected event), recovery
(the fault -> every survivor's first completed step in a later generation) and
lost steps (completed steps done again, plus the step in flight when a member
rolled back). At the end the workers train to a common step; every element id
must have been trained on exactly once (a histogram summed in the step's own
all-reduce) and the weights must equal a single-process replay of the same
global batches (chaos_worker.py --replay: the same workload in one plain process).

Prints one line per fault, a table, and as its last line the JSON summary
{"faults", "recovery_p50_s", "recovery_p90_s", "recovery_max_s",
"vanished_host_s", "lost_steps_max", "exactly_once", "equal_to_replay", ...}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from harness import (EventTail, Job, LauncherProcess, exit_on_sigterm, gaps,
                     nearest_rank_percentile, status_mb, wait_until)

from tensorflow_elastic.observability import events as ev
from tensorflow_elastic.rendezvous.settings import RunSettings

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chaos_worker.py")
KILL_KINDS = ("kill_step", "kill_chief_step", "kill_commit", "kill_sync_join", "kill_chief_join")
HEARTBEAT_TIMEOUT_S = RunSettings().heartbeat_timeout  # the embedded orchestrator's default
WAIT_S = 180.0
ORCHESTRATOR_PORT = 29400  # on its own network namespace: no other process there
# How close the job's weights must be to the replay's: float64 throughout; the Keras workloads
# sum more terms a step (batch statistics, several layers), in another order than one process.
REPLAY_RTOL = {"linear": 1e-9, "multi": 1e-9, "keras": 1e-7, "cnn": 1e-7}


@dataclasses.dataclass
class Fault:
    kind: str
    t0: float
    victim: int
    generation: int
    members: list[int]
    detection_s: float | None = None
    recovery_s: float | None = None
    lost_steps: int | None = None


class ChaosJob(Job):
    """The job: one launcher with an embedded orchestrator, or with `hosts` (tools/netns.Hosts)
    an orchestrator on host 0 and a launcher with one worker on each other host."""

    def __init__(self, tmp: str, args: argparse.Namespace, hosts=None):
        super().__init__()
        if args.trace:
            # The logs show TensorFlow's aborts (TF_CPP_MIN_LOG_LEVEL=0 and TF_CPP_VMODULE: more).
            self.env["TF_CPP_MIN_LOG_LEVEL"] = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1")
        self.control = os.path.join(tmp, "control")
        os.makedirs(self.control)
        self.events = EventTail(os.path.join(tmp, "events.jsonl"))
        self.hosts = hosts
        self.cuts: dict[int, int] = {}  # host -> times its link went down
        worker = [WORKER, "--control", self.control, "--workload", args.workload,
                  "--global_batch", str(args.global_batch),
                  "--compute_ms", str(args.compute_ms), "--bins", str(args.bins),
                  "--local_devices", str(args.local_devices),
                  *(["--trace"] if args.trace else [])]
        launch = [sys.executable, "-m", "tensorflow_elastic.distributed.launch",
                  "--max_restarts=100000", f"--monitor_interval={args.monitor_interval}",
                  "--stop_timeout=10", f"--events_file={self.events.path}",
                  f"--log_dir={os.path.join(tmp, 'logs')}"]
        if hosts is None:
            self.orchestrator = None
            self.launchers = [LauncherProcess(
                [*launch, "--standalone", f"--nworkers=2:{args.workers}",
                 f"--nproc_per_node={args.workers}", *worker], self.env)]
            return
        endpoint = f"{hosts.address(0)}:{ORCHESTRATOR_PORT}"
        self.orchestrator = LauncherProcess(hosts.command(0, [
            sys.executable, "-m", "tensorflow_elastic.rendezvous", "--host", hosts.address(0),
            "--port", str(ORCHESTRATOR_PORT), "--insecure", "--events_file", self.events.path]),
            self.env)
        self.launchers = [LauncherProcess(hosts.command(i, [
            *launch, f"--rdzv_endpoint={endpoint}", f"--nworkers=2:{len(hosts) - 1}",
            "--nproc_per_node=1", *worker]), self.env) for i in range(1, len(hosts))]

    def records(self) -> list[dict]:
        return [r for launcher in self.launchers for r in list(launcher.records)]

    def host_of(self, node: int) -> int:
        """The host (index into Hosts) whose launcher runs `node`'s worker."""
        return next(i + 1 for i, launcher in enumerate(self.launchers)
                    if any(r.get("node") == node for r in list(launcher.records)))

    def finished(self) -> bool:
        return all(launcher.proc.poll() is not None for launcher in self.launchers)

    def launcher_rss_mb(self) -> float:
        """The orchestrator's resident memory (the launcher's, with --standalone)."""
        rss = status_mb((self.orchestrator or self.launchers[0]).proc.pid, "VmRSS")
        return float("nan") if rss is None else rss

    def steps(self) -> list[dict]:
        return [r for r in self.records() if "step" in r and "done" not in r]

    def pid_of(self, node: int) -> int:
        return max((r for r in self.steps() if r["node"] == node), key=lambda r: r["t"])["pid"]

    def generations(self) -> list[dict]:
        """The orchestrator's generation_start events, in order."""
        return [e for e in self.events.poll(ev.GENERATION_START)
                if e.get("source") == "orchestrator"]

    def current(self) -> dict:
        gens = self.generations()
        return gens[-1] if gens else {"generation": 0, "members": []}

    def stepping(self, generation: int, members: list[int], steps: int) -> bool:
        """Every member has completed `steps` steps in `generation`."""
        done = {}
        for r in self.steps():
            if r["generation"] == generation:
                done[r["node"]] = done.get(r["node"], 0) + 1
        return all(done.get(m, 0) >= steps for m in members)

    def check_alive(self) -> None:
        for process in filter(None, (self.orchestrator, *self.launchers)):
            if process.proc.poll() is not None:
                raise RuntimeError(f"{process.proc.args[-1]} exited ({process.proc.returncode}):"
                                   f"\n{process.stderr_tail(40)}")

    def close(self) -> None:
        for process in filter(None, (*self.launchers, self.orchestrator)):
            process.stop(signal.SIGTERM)
        super().close()


def wait(job: ChaosJob, predicate, what: str, timeout: float = WAIT_S, check: bool = True,
         fail: bool = True, also_check=None):
    """predicate()'s first true value; raises after `timeout` (returns None unless `fail`), or
    at once when a launcher exited (unless not `check`) or `also_check()` raised."""

    def checks() -> None:
        if check:
            job.check_alive()
        if also_check is not None:
            also_check()

    try:
        return wait_until(predicate, what, timeout, interval=0.01, check=checks)
    except TimeoutError:
        if fail:
            raise
        return None


def newcomer_joined(job: ChaosJob, after: float, members: list[int], times: int) -> int | None:
    """A node, not among `members`, with `times` node_joined events since `after`
    (1: registered, 2: asks to join)."""
    seen: dict[int, int] = {}
    for e in job.events.poll(ev.NODE_JOINED):
        if e["time"] > after and e["node"] not in members:
            seen[e["node"]] = seen.get(e["node"], 0) + 1
            if seen[e["node"]] >= times:
                return e["node"]
    return None


def kill_itself(job: ChaosJob, pid: int, where: str) -> float:
    """Tells worker `pid` to SIGKILL itself at its next `where` ("commit" or "sync"); returns the
    time it wrote just before the kill."""
    with open(os.path.join(job.control, f"kill-{pid}"), "w") as f:
        f.write(where)
    killed = os.path.join(job.control, f"killed-{pid}")
    wait(job, lambda: os.path.exists(killed), f"the kill in a {where}")
    with open(killed) as f:
        return float(f.read().split()[0])


def inflict(job: ChaosJob, kind: str, rng: random.Random, step_s: float) -> Fault:
    """Waits for the point the fault needs, inflicts it; returns it with its start time."""
    if kind in ("kill_sync_join", "kill_chief_join"):
        # World 2 after the previous fault; its replacement is on its way.
        gen = wait(job, lambda: (lambda g: g if len(g["members"]) == 2
                                 and job.stepping(g["generation"], g["members"], 3) else None)(
            job.current()), "two members training")
        members = gen["members"]
        if kind == "kill_sync_join":
            wait(job, lambda: newcomer_joined(job, gen["time"], members, 1), "a newcomer")
            victim = rng.choice(members)
            t0 = kill_itself(job, job.pid_of(victim), "sync")
        else:
            wait(job, lambda: newcomer_joined(job, gen["time"], members, 2),
                 "a newcomer asking to join")
            time.sleep(rng.uniform(0.0, 0.1))
            victim = min(members)
            t0 = time.time()
            job.send_signal(job.pid_of(victim), signal.SIGKILL)
    else:
        gen = wait(job, lambda: (lambda g: g if len(g["members"]) >= 3
                                 and job.stepping(g["generation"], g["members"], 5) else None)(
            job.current()), "three members training")
        members = gen["members"]
        chief = kind == "kill_chief_step" or (kind == "kill_commit" and rng.random() < 0.5)
        if kind == "kill_newest":
            victim = max(members)
        elif kind == "vanish":
            # A host cut off twice is blocklisted for a while (its node does not come back in
            # place): cut each host in turn.
            victim = min(members, key=lambda m: (job.cuts.get(job.host_of(m), 0), rng.random()))
        else:
            victim = min(members) if chief else rng.choice(members[1:])
        pid = job.pid_of(victim)
        if kind == "kill_commit":
            t0 = kill_itself(job, pid, "commit")
        elif kind == "vanish":
            host = job.host_of(victim)
            last = max(r["t"] for r in job.steps() if r["node"] == victim)
            wait(job, lambda: max(r["t"] for r in job.steps() if r["node"] == victim) > last,
                 "a step of the victim")
            time.sleep(rng.uniform(0.0, step_s))
            t0 = time.time()
            job.hosts.link_down(host)
            job.cuts[host] = job.cuts.get(host, 0) + 1
        elif kind == "stall":
            t0 = time.time()
            job.send_signal(pid, signal.SIGSTOP)
            time.sleep(HEARTBEAT_TIMEOUT_S + 2.0)
            job.send_signal(pid, signal.SIGCONT)
        else:
            last = max(r["t"] for r in job.steps() if r["node"] == victim)
            wait(job, lambda: max(r["t"] for r in job.steps() if r["node"] == victim) > last,
                 "a step of the victim")
            time.sleep(rng.uniform(0.0, step_s))
            t0 = time.time()
            job.send_signal(pid, signal.SIGKILL)
    at = [g for g in job.generations() if g["time"] <= t0][-1]
    return Fault(kind, t0, victim, at["generation"], at["members"])


SLOW_S = HEARTBEAT_TIMEOUT_S * 1.5


def slow_down(job: ChaosJob, kind: str, rng: random.Random) -> dict:
    """A healthy member made slow for longer than the heartbeat timeout: it spins in Python
    (pause_member), or both cores are kept busy by two other processes (busy_cores). Returns
    {"kind", "seconds", "removals"}: the failures detected meanwhile (each a false removal)."""
    gen = wait(job, lambda: (lambda g: g if len(g["members"]) >= 3 and job.stepping(
        g["generation"], g["members"], 5) else None)(job.current()), "three members training")
    t0 = time.time()
    if kind == "pause_member":
        pid = job.pid_of(rng.choice(gen["members"]))
        with open(os.path.join(job.control, f"pause-{pid}"), "w") as f:
            f.write(str(SLOW_S))
        wait(job, lambda: not os.path.exists(os.path.join(job.control, f"pause-{pid}")),
             "the pause to start")
        time.sleep(SLOW_S + 1.0)
    else:
        hogs = [subprocess.Popen([sys.executable, "-c", f"import time\nend = time.time() + "
                                  f"{SLOW_S}\nwhile time.time() < end: pass"]) for _ in range(2)]
        for hog in hogs:
            hog.wait(timeout=SLOW_S + 60)
    wait(job, lambda: job.stepping(job.current()["generation"], job.current()["members"], 5),
         "training after the slow-down")
    removals = [e for e in job.events.poll(ev.FAILURE_DETECTED) if e["time"] >= t0]
    return {"kind": kind, "seconds": round(time.time() - t0, 1), "removals": len(removals),
            "generation_changed": job.current()["generation"] != gen["generation"]}


NET_FAULT_S = 20.0  # how long a packet loss, delay or partition lasts
ORCHESTRATOR_CUT_S = 10.0
NET_FAULTS = ("loss", "delay", "partition", "orchestrator_cut")


def net_fault_kinds(names: str) -> list[str]:
    """--net_faults' comma-separated kinds, in the order given."""
    kinds = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [k for k in kinds if k not in NET_FAULTS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"network faults are {', '.join(NET_FAULTS)}; "
                                         f"got {names!r}")
    return kinds


def network_fault(job: ChaosJob, kind: str) -> dict:
    """A degraded network on the namespaces' job: 5 % packet loss or a 200 ms delay on one worker
    host, an asymmetric partition (one worker host loses every packet to and from another, both
    still reach the orchestrator), or the orchestrator's host cut off from every worker. Returns
    {"kind", "seconds", "removals", "generations", "steps"} over the fault and 5 s after it
    (removals: failures detected; steps: steps the chief completed) and the chief's median
    step time in the 10 s before the fault and during it ("step_ms_before", "step_ms_during"),
    or {"kind", "skipped"}."""
    from tools.netns import FaultUnavailable

    gen = wait(job, lambda: (lambda g: g if len(g["members"]) >= 3 and job.stepping(
        g["generation"], g["members"], 5) else None)(job.current()), "three members training")
    first, second = (job.host_of(m) for m in gen["members"][1:3])
    t0 = time.time()
    try:
        if kind == "loss":
            job.hosts.drop(first, 0.05)
        elif kind == "delay":
            job.hosts.delay(first, 200)
        elif kind == "partition":
            job.hosts.drop(first, peer=second)
        else:
            job.hosts.link_down(0)
    except FaultUnavailable as e:
        return {"kind": kind, "skipped": str(e)}
    time.sleep(ORCHESTRATOR_CUT_S if kind == "orchestrator_cut" else NET_FAULT_S)
    healed = time.time()
    if kind == "orchestrator_cut":
        job.hosts.link_up(0)
    else:
        job.hosts.heal(first)
    time.sleep(5.0)
    end = time.time()
    removals = [e for e in job.events.poll(ev.FAILURE_DETECTED) if t0 <= e["time"] <= end]
    generations = [g for g in job.generations() if t0 <= g["time"] <= end]
    chief = min(job.current()["members"])
    steps = [r for r in job.steps() if r["node"] == chief and t0 <= r["t"] <= end]

    def step_ms(start: float, stop: float) -> float | None:
        times = sorted(r["t"] for r in job.steps()
                       if r["node"] == chief and start <= r["t"] <= stop)
        return round(statistics.median(gaps(times)) * 1e3, 1) if len(times) > 1 else None

    return {"kind": kind, "seconds": round(end - t0, 1), "removals": len(removals),
            "removed": sorted({e.get("node") for e in removals if e.get("node") is not None}),
            "generations": len(generations), "steps": len(steps),
            "step_ms_before": step_ms(t0 - 10.0, t0), "step_ms_during": step_ms(t0, healed)}


def survivors_stayed(job: ChaosJob, survivors: list[int], t0: float) -> None:
    """Raises, saying why, when a survivor of the fault at `t0` left the job: its first step
    of a later generation would never come (a replacement has another node id)."""
    for e in job.events.poll(ev.NODE_LEFT):
        if e["time"] >= t0 and e.get("node") in survivors:
            raise RuntimeError(f"survivor {e['node']} left the job after the fault: "
                               f"{e.get('reason')}")


def measure(job: ChaosJob, fault: Fault) -> None:
    """Waits until every survivor completed a step of a later generation; fills the figures."""
    survivors = [m for m in fault.members if m != fault.victim]

    def recovered():
        firsts = {}
        for r in job.steps():
            if r["node"] in survivors and r["generation"] > fault.generation and r["t"] > fault.t0:
                firsts.setdefault(r["node"], r)
        return firsts if len(firsts) == len(survivors) else None

    firsts = wait(job, recovered, f"recovery from {fault.kind} of node {fault.victim}",
                  also_check=lambda: survivors_stayed(job, survivors, fault.t0))
    fault.recovery_s = max(r["t"] for r in firsts.values()) - fault.t0
    detected = [e["time"] for e in job.events.poll(ev.FAILURE_DETECTED)
                if e["time"] >= fault.t0]
    fault.detection_s = min(detected) - fault.t0 if detected else None
    end = max(r["t"] for r in firsts.values())
    old = [r["step"] for r in job.steps() if r["node"] in survivors
           and r["generation"] <= fault.generation]
    new_first = min(r["step"] for r in firsts.values())
    redone = max(0, max(old, default=0) - new_first + 1)
    rolled_back = [e for e in job.events.poll(ev.STATE_RESTORED)
                   if fault.t0 <= e["time"] <= end]
    fault.lost_steps = redone + max((e.get("lost_steps", 0) for e in rolled_back), default=0)


def trace(job: ChaosJob, fault: Fault) -> str:
    """Each survivor's recovery phases, in ms from the fault to the end of each."""
    end = fault.t0 + fault.recovery_s
    lines = []
    for node in sorted(m for m in fault.members if m != fault.victim):
        marks = [(r["t"], r["trace"]) for r in job.records()
                 if r.get("node") == node and "trace" in r and fault.t0 <= r["t"] <= end]
        first = min(r["t"] for r in job.steps() if r["node"] == node and r["t"] > fault.t0
                    and r["generation"] > fault.generation)
        marks.append((first, "step"))
        lines.append(f"    node {node}: " + " ".join(f"{name} {(t - fault.t0) * 1e3:.0f}"
                                                     for t, name in sorted(marks)))
    return "\n".join(lines)


def replay(args: argparse.Namespace, steps: int) -> dict:
    """The done line of one plain process training the workload on the same global batches."""
    out = subprocess.run([sys.executable, WORKER, "--workload", args.workload, "--replay",
                          str(steps), "--global_batch", str(args.global_batch), "--bins",
                          str(args.bins)], capture_output=True, text=True, timeout=600,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def plan(faults: int, stalls: int, rng: random.Random) -> list[str]:
    kinds = [KILL_KINDS[i % len(KILL_KINDS)] for i in range(faults - stalls)]
    rng.shuffle(kinds)
    for i in range(stalls):
        kinds.insert((i + 1) * len(kinds) // (stalls + 1), "stall")
    # A join fault needs world 2 (the previous fault's replacement on its way): never first.
    if kinds and kinds[0] in ("kill_sync_join", "kill_chief_join"):
        first = next(i for i, k in enumerate(kinds) if k not in ("kill_sync_join",
                                                                 "kill_chief_join"))
        kinds[0], kinds[first] = kinds[first], kinds[0]
    return kinds


def run(args: argparse.Namespace, tmp: str, hosts=None) -> dict:
    """The job, its faults (with `hosts`: --vanish cuts of a host's link) and the checks."""
    import numpy as np

    rng = random.Random(args.seed)
    job = ChaosJob(tmp, args, hosts)
    workers = args.workers if hosts is None else len(hosts) - 1
    faults: list[Fault] = []
    orchestrator_rss: list[tuple[int, float]] = []
    slow: list[dict] = []
    network: list[dict] = []
    hangs = 0
    try:
        gen = wait(job, lambda: (lambda g: g if len(g["members"]) == workers and job.stepping(
            g["generation"], g["members"], 20) else None)(job.current()), "the job to start")
        times = sorted(r["t"] for r in job.steps() if r["node"] == gen["members"][0])
        step_s = statistics.median(gaps(times))
        wait(job, lambda: max(r["step"] for r in job.steps()) >= args.first_fault_step,
             f"step {args.first_fault_step}", timeout=WAIT_S + args.first_fault_step * step_s)
        if hosts is not None:
            kinds = ["vanish"] * args.vanish
        elif args.soak:
            kinds = ["kill_newest"] * args.faults
        else:
            kinds = plan(args.faults, args.stalls, rng)
        for i, kind in enumerate(kinds):
            fault = inflict(job, kind, rng, step_s)
            orchestrator_rss.append((fault.generation, job.launcher_rss_mb()))
            try:
                measure(job, fault)
            except TimeoutError:
                hangs += 1
                raise
            finally:
                faults.append(fault)
            if fault.kind == "vanish":
                time.sleep(1.0)  # past the removal: the host comes back and its worker rejoins
                hosts.link_up(job.host_of(fault.victim))
            print(f"[{i + 1}/{len(kinds)}] {fault.kind:<16} node {fault.victim:>3} gen "
                  f"{fault.generation:>3}: detection {_fmt(fault.detection_s)} recovery "
                  f"{_fmt(fault.recovery_s)} lost steps {fault.lost_steps}", flush=True)
            if args.trace:
                print(trace(job, fault), flush=True)
        for kind in ("pause_member", "busy_cores") if args.slow and hosts is None else ():
            slow.append(slow_down(job, kind, rng))
            print(f"[slow] {slow[-1]}", flush=True)
        for kind in args.net_faults if hosts is not None else ():
            network.append(network_fault(job, kind))
            print(f"[network] {network[-1]}", flush=True)
        target = max(r["step"] for r in job.steps()) + 20
        with open(os.path.join(job.control, "stop.tmp"), "w") as f:
            f.write(str(target))
        os.rename(os.path.join(job.control, "stop.tmp"), os.path.join(job.control, "stop"))

        def trained_to_the_end():
            # Not the last generation's members: members leaving at the end admit waiting
            # nodes (and a worker restarted meanwhile waits for a job that is over).
            members = {r["node"] for r in job.steps() if r["step"] == target}
            done = {r["node"] for r in job.records() if r.get("done")}
            return members if members and members <= done else None

        members = wait(job, trained_to_the_end, "the end of training", check=False)
        finals = [r for r in job.records() if r.get("done")]
        wait(job, job.finished, "the launchers to finish", timeout=30, check=False,
             fail=False)
    finally:
        job.close()
    expected = replay(args, target)
    finished = set(r["node"] for r in finals) >= members
    histogram = all(r["counts"] == expected["counts"] for r in finals)
    print(f"finished at step {target}: nodes {sorted(r['node'] for r in finals)} (steps "
          f"{sorted(r['step'] for r in finals)}), nodes that trained the last step "
          f"{sorted(members)}, id histogram {'as replayed' if histogram else 'DIFFERS'}",
          flush=True)
    exactly_once = finished and all(r["step"] == target and r["counts"] == expected["counts"]
                                    for r in finals)
    equal = finished and all(np.allclose(r["weights"], expected["weights"],
                                         rtol=REPLAY_RTOL[args.workload], atol=1e-12)
                             for r in finals)
    resources = [r for r in job.records() if "resources" in r]
    return {"faults": faults, "hangs": hangs, "exactly_once": exactly_once,
            "resources": resources, "orchestrator_rss": orchestrator_rss, "slow": slow,
            "network": network,
            "equal_to_replay": equal, "steps": target, "step_s": step_s,
            "launcher_codes": [launcher.proc.returncode for launcher in job.launchers]}


def vanished_hosts(args: argparse.Namespace) -> dict | None:
    """The --vanish job on network namespaces; None (and why) where they cannot be made."""
    from tools.netns import Hosts, NetnsUnavailable

    try:
        hosts = Hosts(4)
    except NetnsUnavailable as e:
        print(f"vanished hosts not measured: {e}", flush=True)
        return None
    with hosts, tempfile.TemporaryDirectory(prefix="tfe-chaos-hosts-") as tmp:
        try:
            return run(args, tmp, hosts)
        finally:
            keep(args.keep and f"{args.keep}.hosts", tmp)


def keep(path: str | None, tmp: str) -> None:
    """Copies a job's events file to `path` and its workers' logs to `path`.logs."""
    if path:
        import shutil
        shutil.copy(os.path.join(tmp, "events.jsonl"), path)
        shutil.copytree(os.path.join(tmp, "logs"), f"{path}.logs", dirs_exist_ok=True)


def soak_summary(result: dict) -> dict:
    """Per 50 re-forms: the threads, RSS and descriptors of the member that lived through the
    most generations, and the orchestrator's memory; prints them as a table too."""
    by_node: dict[int, list[dict]] = {}
    for r in result["resources"]:
        by_node.setdefault(r["node"], []).append(r)
    node, records = max(by_node.items(), key=lambda item: (
        item[1][-1]["generation"] - item[1][0]["generation"], -item[0]))
    first = records[0]["generation"]
    rows = []
    for r in records:
        if not rows or r["generation"] - first >= 50 * len(rows) or r is records[-1]:
            rss = [mb for g, mb in result["orchestrator_rss"] if g <= r["generation"]]
            rows.append({"reforms": r["generation"] - first, **r["resources"],
                         "orchestrator_rss_mb": round(rss[-1], 1) if rss else None})
    print(f"\nnode {node}, from generation {first}:")
    print(f"{'re-forms':>9}{'threads':>9}{'rss MB':>9}{'fds':>6}{'orchestrator MB':>17}")
    for row in rows:
        print(f"{row['reforms']:>9}{row['threads']:>9}{row['rss_mb']:>9.1f}{row['fds']:>6}"
              f"{row['orchestrator_rss_mb'] or float('nan'):>17.1f}")
    recovery = [f.recovery_s for f in result["faults"]]
    return {"reforms": rows[-1]["reforms"], "member": node, "rows": rows,
            "recovery_p50_s": round(statistics.median(recovery), 4),
            "recovery_max_s": round(max(recovery), 4), "hangs": result["hangs"],
            "exactly_once": result["exactly_once"], "equal_to_replay": result["equal_to_replay"]}


def _fmt(value: float | None) -> str:
    return "   n/a  " if value is None else f"{value:7.3f}s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=30, help="faults in the run (default 30)")
    parser.add_argument("--stalls", type=int, default=2,
                        help="of the faults, SIGSTOPs past the heartbeat timeout (default 2)")
    parser.add_argument("--first_fault_step", type=int, default=0,
                        help="train to this global step before the first fault (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="the faults' random order and offsets")
    parser.add_argument("--workload", choices=sorted(REPLAY_RTOL), default="linear",
                        help="the training loop (benchmarks/chaos_workloads.py; default linear)")
    parser.add_argument("--global_batch", type=int, default=12)
    parser.add_argument("--bins", type=int, default=1024, help="histogram bins of element ids")
    parser.add_argument("--compute_ms", type=float, default=10.0,
                        help="CPU work between steps of the linear workload (default 10 ms)")
    parser.add_argument("--monitor_interval", type=float, default=1.0,
                        help="the launcher's --monitor_interval (default 1.0, its default)")
    parser.add_argument("--soak", action="store_true",
                        help="a soak instead: --faults kills of the newest member (each a "
                        "shrink and a growth: two re-forms) with --workers 4; reports the "
                        "threads, memory and descriptors of the member that lives through all "
                        "of them, and the orchestrator's memory, per 50 re-forms")
    parser.add_argument("--slow", action="store_true",
                        help="after the faults, make a healthy member slow for 1.5x the heartbeat "
                        "timeout twice (it spins in Python; two other processes keep both cores "
                        "busy) and count the failures detected meanwhile (false_removals)")
    parser.add_argument("--vanish", type=int, default=0,
                        help="after the run, a second job on network namespaces (an orchestrator "
                        "host, three worker hosts; needs root) whose hosts' links go down this "
                        "many times mid-step, each back 1 s after the survivors went on "
                        "(vanished_host_s: the longest link down -> every survivor's first step)")
    parser.add_argument("--net_faults", nargs="?", type=net_fault_kinds, default=[],
                        const=list(NET_FAULTS), metavar="KIND,...",
                        help="a job on network namespaces (as --vanish; after its cuts): 5%% packet loss and a 200 ms delay "
                        "on one worker host, an asymmetric partition between two worker hosts "
                        f"(each {NET_FAULT_S:.0f} s), the orchestrator's host cut off for "
                        f"{ORCHESTRATOR_CUT_S:.0f} s; reports removals, generations, steps "
                        "and the chief's step time before and during each (network_faults). "
                        f"All of them, or those named (of {','.join(NET_FAULTS)})")
    parser.add_argument("--workers", type=int, default=None,
                        help="workers (default 3; 4 with --soak)")
    parser.add_argument("--local_devices", type=int, default=1,
                        help="logical CPU devices each worker drives, one replica each "
                        "(default 1)")
    parser.add_argument("--keep", help="copy the events file here (the workers' logs to "
                        "KEEP.logs; the network-namespace job's to KEEP.hosts and "
                        "KEEP.hosts.logs)")
    parser.add_argument("--trace", action="store_true",
                        help="print when each phase of every survivor's recovery ended")
    args = parser.parse_args(argv)
    if args.workers is None:
        args.workers = 4 if args.soak else 3
    if args.soak:
        args.stalls = 0
    if not 0 <= args.stalls < args.faults:
        parser.error("need 0 <= --stalls < --faults")
    exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="tfe-chaos-") as tmp:
        try:
            result = run(args, tmp)
        finally:
            keep(args.keep, tmp)
    vanished = vanished_hosts(args) if args.vanish or args.net_faults else None
    faults = result["faults"]
    if args.soak:
        print(json.dumps(soak_summary(result)))
        return 0
    kills = [f for f in faults if f.kind != "stall"]
    stalls = [f for f in faults if f.kind == "stall"]
    recovery = [f.recovery_s for f in kills]
    detection = [f.detection_s for f in kills if f.detection_s is not None]
    print(f"\n{'fault':<18}{'count':>6}{'recovery p50':>14}{'max':>9}{'detect p50':>12}"
          f"{'lost max':>10}")
    for kind in (*KILL_KINDS, "stall"):
        of = [f for f in faults if f.kind == kind]
        if of:
            det = [f.detection_s for f in of if f.detection_s is not None]
            print(f"{kind:<18}{len(of):>6}{statistics.median(f.recovery_s for f in of):>14.3f}"
                  f"{max(f.recovery_s for f in of):>9.3f}"
                  f"{statistics.median(det) if det else float('nan'):>12.3f}"
                  f"{max(f.lost_steps for f in of):>10}")
    print(f"steps {result['steps']}, {result['step_s'] * 1e3:.1f} ms/step before the faults, "
          f"launcher exit codes {result['launcher_codes']}, hangs {result['hangs']}")
    summary = {
        "workload": args.workload,
        "faults": len(faults),
        "recovery_p50_s": round(statistics.median(recovery), 4),
        "recovery_p90_s": round(nearest_rank_percentile(recovery, 90), 4),
        "recovery_max_s": round(max(recovery), 4),
        "vanished_host_s": (round(max(f.recovery_s for f in vanished["faults"]), 4)
                            if vanished and vanished["faults"] else None),
        "lost_steps_max": max(f.lost_steps for f in faults),
        "exactly_once": result["exactly_once"],
        "equal_to_replay": result["equal_to_replay"],
        "detection_p50_s": round(statistics.median(detection), 4) if detection else None,
        "detection_p90_s": (round(nearest_rank_percentile(detection, 90), 4) if detection
                            else None),
        "detection_max_s": round(max(detection), 4) if detection else None,
        "stall_recovery_max_s": round(max(f.recovery_s for f in stalls), 4) if stalls else None,
        "hangs": result["hangs"],
    }
    if vanished:
        summary["network_faults"] = vanished["network"]
        summary["vanished_exactly_once"] = vanished["exactly_once"]
        summary["vanished_equal_to_replay"] = vanished["equal_to_replay"]
    if args.slow:
        summary["false_removals"] = sum(s["removals"] for s in result["slow"])
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
