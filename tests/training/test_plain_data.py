"""What members exchange of a State: plain data in, plain data out, never code."""

import collections
import math
import os
import pickle

import numpy as np
import pytest

import tensorflow_elastic as tfe
from tensorflow_elastic.training import plain_data
from tensorflow_elastic.training.plain_data import NotPlainData


@pytest.mark.parametrize("value", [
    None, True, 7, -2.5, "epoch", [1, "a", None], (1, (2, 3)), {"step": 3, "lr": 0.1},
    {"nested": [{"t": (1.0,)}]}, float("inf"),
])
def test_plain_values_come_back_as_they_were(value):
    assert plain_data.decode(plain_data.encode(value)) == value


def test_numpy_values_and_bytes_come_back_with_their_types():
    back = plain_data.decode(plain_data.encode({"n": np.int64(4), "f": np.float32(0.5),
                                                "a": np.arange(6.0).reshape(2, 3),
                                                "b": b"\x00\xff"}))
    assert back["n"] == 4 and type(back["n"]) is np.int64
    assert back["f"] == 0.5 and type(back["f"]) is np.float32
    np.testing.assert_array_equal(back["a"], np.arange(6.0).reshape(2, 3))
    assert back["a"].dtype == np.float64 and back["b"] == b"\x00\xff"


def test_nan_survives():
    assert math.isnan(plain_data.decode(plain_data.encode(float("nan"))))


REFUSED = [
    ({"f": open}, "value\\['f'\\] is a builtin_function_or_method"),
    ({1: "a"}, "key that is not a string"),
    ({"__tfe__": "tuple"}, "reserved key"),
    ({"s": {1, 2}}, "is a set"),
    (np.array(["a"]), "is a ndarray"),
    # Subclasses would come back as their base class: refused instead.
    (collections.OrderedDict(a=1), "is a OrderedDict"),
    (collections.defaultdict(int), "is a defaultdict"),
    (collections.namedtuple("Point", "x y")(1, 2), "is a Point"),
]


@pytest.mark.parametrize("value, says", REFUSED)
def test_anything_else_is_refused_with_what_to_do(value, says):
    with pytest.raises(NotPlainData, match=says):
        plain_data.encode(value)


@pytest.mark.parametrize("value, says", REFUSED + [({"n": np.int64(1), "f": open}, "is a builtin"),
                                                   ({"n": 10**5000}, "cannot be written")])
def test_check_refuses_what_encode_refuses(value, says):
    with pytest.raises(NotPlainData, match=says):
        plain_data.check(value)


def test_a_dict_of_scalars_is_checked_without_encoding(monkeypatch):
    """A State's usual values (a step count), checked at every commit: no encoding."""
    monkeypatch.setattr(plain_data, "encode", lambda value: pytest.fail("encoded"))
    plain_data.check({"step": 3, "lr": 0.1, "name": "a", "done": None, "ok": True})


@pytest.mark.parametrize("blob", [
    b"\x80\x04not json", b'{"__tfe__": "object", "module": "os"}',
    b'{"__tfe__": "ndarray", "dtype": "|O", "shape": [1], "values": [1]}',
    b'{"__tfe__": "ndarray", "dtype": "<f8", "shape": [4], "values": [1]}',
    b'{"__tfe__": "ndarray", "dtype": "<f8", "shape": [-1], "values": []}',
    b'{"__tfe__": "ndarray", "dtype": "<f8", "shape": [1], "values": ["x"]}',
])
def test_bytes_that_are_not_plain_data_are_refused(blob):
    with pytest.raises(NotPlainData):
        plain_data.decode(blob)


def test_an_oversized_blob_is_refused_before_it_is_parsed():
    with pytest.raises(NotPlainData, match="more than"):
        plain_data.decode(b" " * (plain_data.MAX_BYTES + 1))


class _CreatesAFile:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class _PeerSends:
    """A job whose other member (node 0) exchanges `blob`."""

    node_id = 1

    def __init__(self, blob):
        self.blob = blob

    def exchange(self, topic, value):
        return {0: self.blob, 1: value}

    def snapshot_extras(self):
        return None, []

    def sync_facts(self):
        return {}

    def gathered_at_start(self):
        return None

    def take_sync_facts(self, facts):
        pass


def test_a_member_that_exchanges_a_crafted_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = str(tmp_path / "pwned")
    crafted = pickle.dumps(({"step": 9}, 9, _CreatesAFile(marker)))
    state = tfe.State(step=1)
    state.bind(_PeerSends(crafted))
    with pytest.raises(NotPlainData, match="not plain data"):
        state.sync()
    assert not os.path.exists(marker)
    assert state.step == 1


def test_a_member_whose_message_has_the_wrong_shape_is_refused():
    state = tfe.State(step=1)
    state.bind(_PeerSends(plain_data.encode({"values": {"step": 9}, "commits": "9"})))
    with pytest.raises(NotPlainData, match="not \\{values, commits, layout\\}"):
        state.sync()
    assert state.step == 1


def test_a_value_that_is_not_plain_data_fails_at_the_commit_that_holds_it():
    state = tfe.State(step=0)
    state.step = {1, 2}
    with pytest.raises(NotPlainData, match="value\\['step'\\] is a set"):
        state.save()
