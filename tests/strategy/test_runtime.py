"""The runtime's checks that need no cluster (a stand-in session; the rest runs in multi-process tests)."""

import os
import subprocess
import sys
import socket
import threading
import time

import pytest

from tensorflow_elastic import environment, memory, net
from tensorflow_elastic.errors import ElasticJobFailed
from tensorflow_elastic.membership.session import MembershipSession
from tensorflow_elastic.rendezvous import JobCompleteError, Membership
from tensorflow_elastic.rendezvous.types import NodeBounds
from tensorflow_elastic.strategy import cluster, runtime
from tensorflow_elastic.strategy.interrupts import CollectiveInterrupter


class _UnusedClient:
    """The checks below never talk to the orchestrator."""


@pytest.fixture
def job(monkeypatch):
    rt = runtime.ElasticRuntime(
        MembershipSession(_UnusedClient(), "127.0.0.1:1", NodeBounds(2, 4)),
        CollectiveInterrupter())
    monkeypatch.setattr(runtime, "_runtime", rt)
    return rt


def test_matching_or_omitted_bounds_return_the_runtime(job):
    assert runtime.ensure_initialized() is job
    assert runtime.ensure_initialized(min_nodes=2, max_nodes=4) is job


@pytest.mark.parametrize("bounds, name", [((3, None), "min_nodes=3"), ((None, 5), "max_nodes=5")])
def test_contradicting_bounds_are_refused(job, bounds, name):
    with pytest.raises(ValueError, match=rf"{name} differs from the job's"):
        runtime.ensure_initialized(*bounds)


def test_the_reserved_port_is_held_until_the_server_takes_it():
    reservation = net.hold_port("127.0.0.1")
    port = reservation.getsockname()[1]
    rt = runtime.ElasticRuntime(
        MembershipSession(_UnusedClient(), f"127.0.0.1:{port}", NodeBounds(1, 1)),
        CollectiveInterrupter(), address_reservation=reservation)
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    rt.release_address()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))


def _passed_down(monkeypatch) -> tuple[str, int]:
    """A port held the way the launcher's agent hands it to a worker: (address, its port)."""
    agent_copy = net.hold_port("127.0.0.1")
    port = agent_copy.getsockname()[1]
    monkeypatch.setenv(environment.ADDRESS_FD, str(os.dup(agent_copy.fileno())))
    agent_copy.close()  # the agent lets go once the worker started
    return f"127.0.0.1:{port}", port


def test_a_port_passed_down_held_stays_held_without_a_gap(monkeypatch):
    address, port = _passed_down(monkeypatch)
    kept, held = runtime._reserve(address)
    assert kept == address and held.getsockname()[1] == port
    assert environment.ADDRESS_FD not in os.environ and not held.get_inheritable()
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    held.close()


def test_a_port_passed_down_for_another_address_is_let_go(monkeypatch):
    _, stale_port = _passed_down(monkeypatch)
    with net.hold_port("127.0.0.1") as probe:
        wanted = probe.getsockname()[1]
    _, held = runtime._reserve(f"127.0.0.1:{wanted}")
    assert held.getsockname()[1] == wanted
    held.close()
    with socket.socket() as other:
        other.bind(("127.0.0.1", stale_port))


def test_a_given_address_whose_port_is_taken_fails_at_init_with_the_fix(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        monkeypatch.setattr(runtime, "_runtime", None)
        with pytest.raises(ElasticJobFailed, match=f"{address} cannot be used.*free port"):
            runtime.init(endpoint="127.0.0.1:1", address=address)


def test_init_has_tensorflow_pool_cpu_tensors_before_its_first_op(monkeypatch):
    monkeypatch.delenv(memory.TENSOR_POOL_ENV, raising=False)
    monkeypatch.delenv(environment.ENDPOINT, raising=False)
    monkeypatch.setattr(runtime, "_runtime", None)
    with pytest.raises(ElasticJobFailed, match="no orchestrator endpoint"):
        runtime.init(endpoint="")
    assert os.environ[memory.TENSOR_POOL_ENV] == "true"


class _SlowProbes:
    """A stand-in probe: every probe takes a while, some peers never answer."""

    def __init__(self, dead: set[int]):
        self.dead = dead
        self.active = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def check_peer(self, peer: int, timeout_ms: int) -> None:
        with self._lock:
            self.active += 1
            self.most_at_once = max(self.most_at_once, self.active)
        time.sleep(0.2)
        with self._lock:
            self.active -= 1
        if peer in self.dead:
            raise RuntimeError("deadline exceeded")


def test_peers_are_probed_at_once_and_only_the_silent_ones_are_reported(monkeypatch):
    probes = _SlowProbes(dead={2, 5})
    monkeypatch.setattr(cluster, "check_peer", probes.check_peer)
    members = {n: f"127.0.0.1:{2000 + n}" for n in (1, 2, 3, 5)}
    assert cluster.unreachable_peers(members, node_id=1) == [2, 5]
    assert probes.most_at_once == 3  # one timeout for all, not one per peer


def test_the_binding_refuses_a_peer_probe_with_no_bound(subprocess_env):
    """TensorFlow reads a timeout of 0 as no bound: the binding (public, beside check_peer)
    refuses it rather than wait for ever on a silent peer."""
    code = ("from tensorflow.python.eager import context\n"
            "from tensorflow_elastic.ops import load_binding\n"
            "from tensorflow_elastic.strategy import cluster\n"
            "context.context().ensure_initialized()\n"
            "try:\n"
            "    load_binding().check_peer_health(cluster._context_handle(),\n"
            "                                     cluster.task_device(1), 0)\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    done = subprocess.run([sys.executable, "-c", code], env=subprocess_env,
                          capture_output=True, text=True, timeout=120)
    assert "timeout_ms=0: a peer's probe needs a bound above 0" in done.stdout, done.stderr


@pytest.fixture
def serving_generation_3(monkeypatch):
    """The interrupter of a member whose TensorFlow serves generation 3; what happened."""
    happened = []
    monkeypatch.setattr(cluster, "abort_collectives", lambda reason: happened.append("abort"))
    return CollectiveInterrupter(serving=3), happened


def _move(interrupts: CollectiveInterrupter, generation: int, happened: list) -> None:
    with interrupts.moving_to(generation):
        happened.append(f"moved to {generation}")


def test_news_of_a_newer_generation_aborts_the_collectives(serving_generation_3):
    interrupts, happened = serving_generation_3
    interrupts.peers_lost("membership changed", 4)
    assert happened == ["abort"]


def test_old_news_leaves_the_generation_that_is_served_alone(serving_generation_3):
    """A watch update read before this node moved to generation 3, acted on after it."""
    interrupts, happened = serving_generation_3
    interrupts.peers_lost("membership changed", 3)
    assert happened == []


def test_a_generation_that_ended_while_this_node_moved_to_it_is_aborted_after_the_move(
        serving_generation_3):
    interrupts, happened = serving_generation_3
    interrupts.peers_lost("membership changed", 5)  # generation 4 ended before the move
    _move(interrupts, 4, happened)
    assert happened == ["abort", "moved to 4", "abort"]
    _move(interrupts, 5, happened)
    assert happened[3:] == ["moved to 5"]


def test_a_loss_that_is_no_membership_change_always_aborts(serving_generation_3):
    interrupts, happened = serving_generation_3
    interrupts.peers_lost("heartbeats stopped", None)
    assert happened == ["abort"]


def test_no_probe_when_the_orchestrator_already_moved_on(job, monkeypatch):
    monkeypatch.setattr(cluster, "abort_collectives", lambda reason: None)
    job.session.membership = Membership(0, 3, {0: "a", 1: "b"}, 0)
    reported = []
    monkeypatch.setattr(job.session, "report_failure",
                        lambda peers, reason, detail: reported.append(peers))

    def probe(members, node_id):
        raise AssertionError("no probe on the way back")

    monkeypatch.setattr(cluster, "unreachable_peers", probe)
    job._interrupts.peers_lost("membership changed", 4)
    job.report_failure(RuntimeError("collective aborted"))
    assert reported == [[]]


class _Synced:
    commits = 3

    def __init__(self):
        self.syncs = 0

    def sync(self):
        self.syncs += 1


def test_a_sync_done_after_its_generation_ended_re_forms_before_the_step(job, monkeypatch):
    """Its collectives completed before the abort: the step would only find its first one
    aborted, a whole computation later."""
    monkeypatch.setattr(cluster, "abort_collectives", lambda reason: None)
    job.session.membership = Membership(0, 3, {0: "a", 1: "b"}, 0)
    reforms = []

    def reform(state):
        reforms.append(job.generation)
        job.session.membership = Membership(0, 4, {0: "a"}, 0)

    monkeypatch.setattr(job, "_reform", reform)
    monkeypatch.setattr(job.session, "tell_agent", lambda: None)
    job._interrupts.peers_lost("membership changed", 4)  # while generation 3's sync ran
    state = _Synced()
    job._sync_until_it_holds(state)
    assert reforms == [3] and state.syncs == 2


def _hang_after(bound_exit_call: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A process that arms the exit deadline with `bound_exit_call`, then hangs."""
    script = ("import threading\n"
              "from tensorflow_elastic.strategy.runtime import bound_exit\n"
              f"{bound_exit_call}\n"
              "threading.Event().wait(120)\n")
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=90)


def test_an_exit_that_hangs_is_ended_with_every_thread_s_stack(subprocess_env):
    """The deadline `_exit` arms at interpreter exit: a process stuck past it ends with code 1."""
    done = _hang_after("bound_exit(1)", subprocess_env)
    assert done.returncode == 1
    assert "most recent call first" in done.stderr and "<string>" in done.stderr


def test_an_exit_that_hangs_after_the_training_finished_ends_successfully(subprocess_env):
    """This node's part of the job is done: a hang at exit must not fail it (nor make its
    agent start it again)."""
    done = _hang_after("bound_exit(1, finished=True)", subprocess_env)
    assert done.returncode == 0
    assert "did not exit within 1 s ($TFE_EXIT_TIMEOUT)" in done.stderr
    assert "most recent call first" in done.stderr


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_an_exit_timeout_that_is_no_positive_duration_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(environment.EXIT_TIMEOUT, value)
    with pytest.raises(ValueError, match=r"\$TFE_EXIT_TIMEOUT="):
        environment.duration(environment.EXIT_TIMEOUT, runtime.DEFAULT_EXIT_TIMEOUT_S)


def test_init_refuses_a_bad_exit_timeout_before_anything_else(subprocess_env):
    script = "import tensorflow_elastic as tfe\ntfe.init(endpoint='127.0.0.1:9')\n"
    env = dict(subprocess_env, TFE_EXIT_TIMEOUT="nan", TFE_ORCHESTRATOR_WAIT="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=90)
    assert done.returncode == 1
    assert "$TFE_EXIT_TIMEOUT='nan' must be a number of seconds above 0" in done.stderr


def test_a_node_told_the_job_is_complete_when_it_joins_again_exits_successfully(job, monkeypatch):
    """A newcomer formed with members that were past training: its sync ends and the join
    after it says the job is complete; nothing is left to train."""
    def complete():
        raise JobCompleteError("run 'job': the job is complete (its members finished training)")
    monkeypatch.setattr(job.session, "join_next_generation", complete)
    monkeypatch.setattr(job.session.client, "close", lambda: None, raising=False)
    with pytest.raises(SystemExit) as exited:
        job._move_to_next_generation(state=None)
    assert exited.value.code == 0


class _PreparingState:
    """Records what the runtime asks of a state before its first sync."""

    def __init__(self):
        self.asked = []

    def bind(self, job):
        self.asked.append("bind")

    def prepare_syncs(self):
        self.asked.append("prepare_syncs")

    def prepare_to_join(self):
        self.asked.append("prepare_to_join")


def test_a_member_prepares_its_state_s_syncs_before_its_first(job):
    job.session.membership = Membership(0, 3, {0: "a", 1: "b"}, 0)
    state = _PreparingState()
    job._begin_training(state)
    assert state.asked == ["bind", "prepare_syncs"]


@pytest.fixture
def newcomer(job, monkeypatch):
    """A standby node; its joins, syncs and finish recorded, not run."""
    monkeypatch.setattr(MembershipSession, "standby", property(lambda self: True))
    done = []
    monkeypatch.setattr(job, "_move_to_next_generation", lambda state: done.append("join"))
    monkeypatch.setattr(job, "_sync_until_it_holds", lambda state: done.append("sync"))
    monkeypatch.setattr(job.session, "finish", lambda step: done.append("finish"))
    return job, done


@pytest.fixture
def fit_newcomer(newcomer):
    """A standby node that warmed `fit` up."""
    newcomer[0].join_at_fit_start()
    return newcomer


class _Commits(_PreparingState):
    commits = 0


def test_a_newcomer_that_warmed_up_fit_joins_inside_its_step_not_before(fit_newcomer):
    """The members wait for neither its input's distribution nor the rest of `fit`'s start."""
    job, done = fit_newcomer
    state = _Commits()

    def step():
        done.append("fit starts")
        job.join_in_step()
        job.join_in_step()  # joined: nothing more
        done.append("first batch")

    job.train(state, step)
    assert state.asked == ["bind", "prepare_to_join"]
    assert done == ["fit starts", "join", "sync", "first batch", "finish"]


@pytest.mark.parametrize("how", ["returns", "commits"])
def test_a_step_that_never_joins_after_the_fit_warm_up_fails_with_the_fix(fit_newcomer, how):
    job, done = fit_newcomer

    def step():
        if how == "commits":
            job.commit(_Commits())

    with pytest.raises(ElasticJobFailed, match="ElasticCallback"):
        job.train(_Commits(), step)
    assert "join" not in done and "finish" not in done


def test_an_error_raised_before_the_pending_join_is_raised_as_it_is(fit_newcomer, monkeypatch):
    """Not a fault of the job's (this node is no member yet): no recovery, no re-form."""
    job, done = fit_newcomer
    monkeypatch.setattr(job, "_recover_step", lambda state, error: pytest.fail("recovered"))

    def step():
        raise cluster_error()

    with pytest.raises(type(cluster_error())):
        job.train(_Commits(), step)
    assert done == []


def cluster_error() -> Exception:
    from tensorflow.python.framework import errors
    return errors.UnavailableError(None, None, "a peer is gone")


def test_a_newcomer_that_did_not_warm_up_fit_joins_before_its_step(newcomer):
    job, done = newcomer
    job.train(_Commits(), lambda: done.append("step"))
    assert done == ["join", "sync", "step", "finish"]


def test_an_error_that_ends_the_join_inside_the_step_is_raised_as_it_is(fit_newcomer,
                                                                         monkeypatch):
    """Not recovered again by the loop, and with the cause it was raised with, though Keras'
    `fit` drops it on the way."""
    job, done = fit_newcomer
    cause = ValueError("the layouts differ")

    def join(state):
        raise ElasticJobFailed("this node's state could not be synced") from cause

    monkeypatch.setattr(job, "_move_to_next_generation", join)
    monkeypatch.setattr(job, "_recover_step", lambda state, error: pytest.fail("recovered"))

    def step():
        try:
            job.join_in_step()
        except Exception as error:
            raise error from None  # what Keras 3's traceback filtering does

    with pytest.raises(ElasticJobFailed) as raised:
        job.train(_Commits(), step)
    assert raised.value.__cause__ is cause


def test_a_failure_after_the_join_inside_the_step_is_recovered_from_the_synced_commit(
        fit_newcomer, monkeypatch):
    job, done = fit_newcomer
    state = _Commits()

    def sync(state):
        state.commits = 7  # the members' commit
        done.append("sync")

    monkeypatch.setattr(job, "_sync_until_it_holds", sync)
    recovered_from = []
    monkeypatch.setattr(job, "_recover_step",
                        lambda state, error: recovered_from.append(job._commits_before))
    calls = []

    def step():
        job.join_in_step()
        calls.append(1)
        if len(calls) == 1:
            raise cluster_error()

    job.train(state, step)
    assert recovered_from == [7] and done == ["join", "sync", "finish"]
