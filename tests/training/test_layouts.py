"""The members' layout check at the sizes users train: thousands of variables, many members."""

import concurrent.futures
import zlib

import pytest

from tensorflow_elastic.errors import GenerationEnded, StateLayoutMismatch
from tensorflow_elastic.rendezvous import Client, Orchestrator
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.training import layouts, plain_data

MEMBERS = 16


def _big_layout(count: int = 2000) -> list[layouts.Entry]:
    """A large Keras model with Adam: each weight and its two slots, long paths."""
    return [(f"functional/transformer_block_{i // 12}/multi_head_attention/dense_{i % 12}/"
             f"{kind}", (768, 3072 if i % 2 else 768), "float32")
            for i in range(count // 3) for kind in ("kernel", "adam/m", "adam/v")][:count]


def test_a_large_layout_is_compared_by_a_digest_of_a_few_dozen_bytes():
    assert len(layouts.digest(_big_layout())) < 200


def test_the_detail_of_any_layout_fits_the_orchestrator_s_limit_and_says_where_it_is_cut():
    huge = _big_layout(60000)  # too long to send whole: a head of it is sent
    packed = layouts.detail(huge)
    assert len(packed) <= RunSettings().max_value_bytes
    head = layouts._detail_message(packed)  # noqa: SLF001 - what a member reads
    assert 0 < len(head) < len(huge) and head == huge[:len(head)]
    mine = huge[:len(head)] + [("extra", (), "float32")] + huge[len(head):]
    assert layouts.first_difference(mine, head, "the members have", len(huge)) == (
        f"after variable #{len(head) - 1}: the first {len(head)} agree ({len(huge) + 1} vs "
        f"{len(huge)} variables)")


class _Member:
    """A member exchanging through a real orchestrator (as MembershipSession.exchange does)."""

    def __init__(self, client: Client, generation: int):
        self.client, self.generation, self.node_id = client, generation, client.node_id

    def exchange(self, topic, value):
        return self.client.synchronize(f"{topic}-{self.generation}", value)


@pytest.mark.parametrize("differing", [False, True])
def test_sixteen_members_check_two_thousand_variables_through_the_orchestrator(differing):
    layout = _big_layout()
    other = layout[:1000] + [(layout[1000][0], (768, 1), "float32")] + layout[1001:]
    # The test's clients send no heartbeats: a timeout no loaded machine reaches.
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(heartbeat_timeout=120)) as server:
        clients = [Client(server.endpoint, "job") for _ in range(MEMBERS)]
        try:
            with concurrent.futures.ThreadPoolExecutor(MEMBERS) as pool:
                joins = [pool.submit(c.join, f"127.0.0.1:{21000 + i}", MEMBERS, MEMBERS,
                                     timeout=60) for i, c in enumerate(clients)]
                generation = max(join.result(timeout=90).generation for join in joins)
                members = [_Member(c, generation) for c in clients]
                source = min(m.node_id for m in members)
                odd = max(m.node_id for m in members)
                checks = {m.node_id: pool.submit(
                    layouts.check, m, other if differing and m.node_id == odd else layout, source)
                    for m in members}
                outcomes = {}
                for node_id, check in checks.items():
                    try:
                        check.result(timeout=90)
                        outcomes[node_id] = None
                    except (GenerationEnded, StateLayoutMismatch) as e:
                        outcomes[node_id] = e
        finally:
            for c in clients:
                c.close()
    if not differing:
        assert all(outcome is None for outcome in outcomes.values())
        return
    assert isinstance(outcomes[odd], StateLayoutMismatch)
    assert "at variable #1000" in str(outcomes[odd]) and "(768, 1)" in str(outcomes[odd])
    assert all(isinstance(outcomes[n], GenerationEnded) for n in outcomes if n != odd)


def test_a_member_s_layout_that_expands_past_the_bound_is_refused():
    bomb = plain_data.encode(zlib.compress(b"[" + b" " * (layouts.MAX_EXPANDED_BYTES + 10) + b"]"))
    with pytest.raises(plain_data.NotPlainData, match="not a list|does not decompress"):
        layouts._detail_message(bomb)  # noqa: SLF001 - what a member reads
