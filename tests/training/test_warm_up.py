"""`tensorflow_elastic.warm_up`: the step runs once on a node about to join a running job (a
standby node), and nowhere else."""

from types import SimpleNamespace

import pytest

import tensorflow_elastic as tfe
from tensorflow_elastic.strategy import runtime as runtime_lib


@pytest.fixture
def runtime_as(monkeypatch):
    def use(standby: bool | None):
        runtime = None if standby is None else SimpleNamespace(
            session=SimpleNamespace(standby=standby), asked=[])
        if runtime is not None:
            runtime.join_at_fit_start = lambda: runtime.asked.append("join_at_fit_start")
        monkeypatch.setattr(runtime_lib, "_runtime", runtime)
        return runtime

    return use


def test_a_joining_node_runs_its_step_once_with_its_arguments(runtime_as):
    runtime_as(standby=True)
    calls = []
    assert tfe.warm_up(lambda *args, **kwargs: calls.append((args, kwargs)), 1, batch=2)
    assert calls == [((1,), {"batch": 2})]


@pytest.mark.parametrize("standby", [False, None], ids=["member", "no_runtime"])
def test_a_member_or_a_process_outside_a_job_runs_nothing(runtime_as, standby):
    runtime_as(standby=standby)
    calls = []
    assert not tfe.warm_up(lambda: calls.append(1))
    assert calls == []


def test_keras_warm_up_runs_nothing_on_a_member(runtime_as):
    runtime_as(standby=False)
    model = SimpleNamespace(fit=lambda *args, **kwargs: pytest.fail("fit ran on a member"))
    assert not tfe.keras.warm_up(model, dataset=None)


def test_keras_warm_up_runs_fit_then_leaves_the_join_to_the_fit_call_s_start(runtime_as,
                                                                             monkeypatch):
    runtime = runtime_as(standby=True)
    monkeypatch.setattr("tensorflow_elastic.training.keras._follow_world_size",
                        lambda model, strategy: None)
    model = SimpleNamespace(distribute_strategy=None,
                            fit=lambda *args, **kwargs: runtime.asked.append("fit"))
    assert tfe.keras.warm_up(model, dataset=None)
    assert runtime.asked == ["fit", "join_at_fit_start"]


def test_a_tf_keras_newcomer_joins_before_its_fit_call(runtime_as, monkeypatch):
    """tf-keras' TensorBoard and ModelCheckpoint choose at the call's start whether this
    worker is the chief: a standby node alone would take itself for it."""
    runtime = runtime_as(standby=True)
    monkeypatch.setattr("tensorflow_elastic.training.keras._follow_world_size",
                        lambda model, strategy: None)
    legacy = type("Sequential", (), {"__module__": "tf_keras.src.engine.sequential",
                                     "distribute_strategy": None,
                                     "fit": lambda self, *a, **k: runtime.asked.append("fit")})
    assert tfe.keras.warm_up(legacy(), dataset=None)
    assert runtime.asked == ["fit"]
