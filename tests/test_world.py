"""tfe.rank(), size(), local_rank(), is_chief() follow the runtime's membership (a stand-in
runtime: no orchestrator, no cluster)."""

import json
import types

import pytest

import tensorflow_elastic as tfe
from tensorflow_elastic import environment
from tensorflow_elastic.errors import ElasticJobFailed
from tensorflow_elastic.rendezvous import Membership
from tensorflow_elastic.strategy import runtime as runtime_lib


@pytest.fixture
def runtime(monkeypatch):
    """A stand-in runtime whose membership the test replaces, as a re-form does."""
    stand_in = types.SimpleNamespace(membership=None)
    monkeypatch.setattr(runtime_lib, "_runtime", stand_in)
    return stand_in


def generation(node_id, members, number=1):
    return Membership(node_id, number, {m: f"h:{m}" for m in members}, min(members))


def test_they_follow_the_membership_across_re_forms(runtime):
    runtime.membership = generation(5, [2, 5, 7])
    assert (tfe.rank(), tfe.size(), tfe.is_chief()) == (1, 3, False)
    runtime.membership = generation(5, [5, 7, 9, 11], number=2)  # the chief left, two joined
    assert (tfe.rank(), tfe.size(), tfe.is_chief()) == (0, 4, True)


def test_local_rank_is_the_launcher_s_slot(monkeypatch):
    monkeypatch.setenv(environment.LOCAL_RANK, "3")
    assert tfe.local_rank() == 3
    monkeypatch.delenv(environment.LOCAL_RANK)
    assert tfe.local_rank() == 0


def test_a_worker_waiting_to_join_has_no_rank_yet(runtime):
    with pytest.raises(RuntimeError, match="not a member of a generation yet"):
        tfe.rank()


def test_without_init_tf_config_answers(monkeypatch):
    monkeypatch.setattr(runtime_lib, "_runtime", None)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]},
                                                "task": {"type": "worker", "index": 2}}))
    assert (tfe.rank(), tfe.size(), tfe.is_chief()) == (2, 3, False)


def test_without_init_or_tf_config_it_says_to_call_init(monkeypatch):
    monkeypatch.setattr(runtime_lib, "_runtime", None)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ElasticJobFailed, match="init\\(\\) has not been called"):
        tfe.size()


def test_they_are_public():
    assert {"rank", "size", "local_rank", "is_chief"} <= set(tfe.__all__)
