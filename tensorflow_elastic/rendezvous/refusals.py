"""Why a run refuses a call: the checks of a request against the run's state, and the messages
that tell the caller what to do next.

Every check reads the state only and raises a typed error (see errors.py) whose reason code
lets the client act without parsing the message; nothing here changes the run.
"""

from __future__ import annotations

from tensorflow_elastic.rendezvous.errors import (
    GenerationChangedError, InvalidArgumentError, JobCompleteError, LimitReachedError,
    NodeRemovedError,
    RendezvousError, RendezvousTimeoutError, RunFailedError, NODE_REMOVED_MAY_RETURN, NOT_MEMBER,
    RUN_MISMATCH, UNKNOWN_NODE)
from tensorflow_elastic.rendezvous.run_state import Node, RunState
from tensorflow_elastic.rendezvous.types import Phase


def check_last_generation(last_generation: int, generation: int) -> None:
    """Refuses a join from a generation the run has not reached (for a run that does not exist
    yet, ``generation`` is 0: checked before the join creates it)."""
    if last_generation > generation:
        raise _not_reached(f"last_generation={last_generation}", generation, "pass")


def check_config(state: RunState, min_nodes: int, max_nodes: int) -> None:
    if (min_nodes, max_nodes) != (state.min_nodes, state.max_nodes):
        raise RendezvousError(
            f"run {state.run_id!r} was started with min_nodes={state.min_nodes} "
            f"max_nodes={state.max_nodes} but this node asks for {min_nodes}:{max_nodes}; "
            f"start every launcher with the same --nnodes and --nproc_per_node, or the same "
            f"--nworkers", reason=RUN_MISMATCH)


def check_not_failed(state: RunState) -> None:
    if state.phase == Phase.FAILED:
        raise RunFailedError(f"run {state.run_id!r} failed: {state.reason}")


def job_complete(state: RunState) -> JobCompleteError:
    """For a node that comes after the end of the one job the orchestrator serves, or once
    its members finished training (see RunState.job_finished)."""
    why = state.reason if state.phase.ended else "its members finished training and leave"
    return JobCompleteError(f"run {state.run_id!r}: the job is complete ({why}), "
                            f"nothing is left to train; a new job starts its own orchestrator "
                            f"(or uses another --run_id on a shared one)")


def known_node(state: RunState, node_id: int) -> Node:
    """The node with this id; raises if it was removed or never given out."""
    if state.was_removed(node_id):
        raise removed_error(state, node_id)
    node = state.nodes.get(node_id)
    if node is None:
        raise RendezvousError(
            f"node id {node_id} was never given out in run {state.run_id!r}; join "
            f"without a node id to get one", reason=UNKNOWN_NODE)
    return node


def check_heartbeat(state: RunState, node_id: int, generation: int) -> None:
    check_not_failed(state)
    known_node(state, node_id)
    if generation > state.generation:
        raise _not_reached(f"generation {generation}", state.generation, "send")


def check_same_address(node: Node, address: str) -> None:
    if node.address != address:
        raise RendezvousError(
            f"node {node.node_id} joined with address {node.address}, not {address}; a node "
            f"keeps its address: join without a node id to join as a new node",
            reason=UNKNOWN_NODE)


def check_nonce_address(node: Node, nonce: str, address: str) -> None:
    """Refuses a join retried with a nonce another address sent."""
    if node.address != address:
        raise InvalidArgumentError(
            f"nonce {nonce!r} was sent by {node.address}, not {address}; a nonce "
            f"names one node's join attempt: send a new random nonce per join")


def removal(state: RunState, node_id: int) -> str:
    """Says that and why a node was removed."""
    return (f"node {node_id} was removed from run {state.run_id!r} "
            f"({state.removal_cause(node_id)})")


def removed_error(state: RunState, node_id: int) -> NodeRemovedError:
    removed = removal(state, node_id)
    if node_id in state.returnable:
        return NodeRemovedError(f"{removed}; its process may still be alive: join again with "
                                f"its id from its address to come back",
                                reason=NODE_REMOVED_MAY_RETURN)
    return NodeRemovedError(f"{removed}; node ids are never reused: join without a node id "
                            f"to come back as a new node")


def check_member(state: RunState, node_id: int, generation: int, waiting_for: str = "") -> None:
    """Raises unless the node is a member of the current generation ``generation``."""
    check_not_failed(state)
    known_node(state, node_id)
    during = f" while waiting for {waiting_for}" if waiting_for else ""
    if generation > state.generation:
        raise _not_reached(f"generation {generation}", state.generation, "use")
    if generation < state.generation or state.phase != Phase.ACTIVE:
        raise GenerationChangedError(
            f"generation {generation} has ended{during} (the run is now "
            f"{state.phase.lower()} at generation {state.generation}): join again with "
            f"last_generation={generation} to get the new membership")
    if node_id not in state.members:
        raise RendezvousError(
            f"node {node_id} is not a member of generation {generation}; it is waiting to "
            f"be admitted: join to wait for the next generation", reason=NOT_MEMBER)


def check_job_not_finished(state: RunState, generation: int, waiting_for: str) -> None:
    """A gather after a member left having finished training: nothing is left to train in the
    generation, whoever else it holds (a newcomer admitted as that member's peer was lost
    after the exit barrier); the node joins again and is told the job is complete."""
    if state.job_finished:
        raise GenerationChangedError(
            f"generation {generation} has ended while waiting for {waiting_for}: the job "
            f"finished (a member left having finished training); join again to be told so")


def is_current_member(state: RunState, node_id: int, generation: int) -> bool:
    """Whether a known node speaks from the current generation (False: from an ended one)."""
    if generation < state.generation or state.phase != Phase.ACTIVE:
        check_not_failed(state)
        known_node(state, node_id)
        return False
    check_member(state, node_id, generation)
    return True


def peers_to_probe(state: RunState, node_id: int, generation: int,
                   peers: list[int]) -> list[int]:
    """The peers of a failure report that the orchestrator probes.

    A report made in an ended generation still counts for the peers that are members now;
    one made in the current generation must name only its members.
    """
    if node_id in peers:
        raise InvalidArgumentError(
            f"node {node_id} reported itself among other peers; report its death alone")
    members = state.members
    if not is_current_member(state, node_id, generation):
        return [peer for peer in peers if peer in members]
    for peer in peers:
        if peer not in members:
            raise InvalidArgumentError(
                f"peer {peer} is not a member of generation {generation} (members: "
                f"{sorted(members)}); report only peers of your generation")
    return peers


def check_gather_room(state: RunState, key: str, generation: int, max_gathers: int) -> None:
    """Refuses a new barrier or exchange once the generation holds ``max_gathers``."""
    gathers = state.gathers
    if not gathers.holds(key) and len(gathers) >= max_gathers:
        raise LimitReachedError(
            f"generation {generation} already holds {len(gathers)} barriers and exchanges "
            f"(--max_gathers); a new generation starts with none")


def missing_from_gather(state: RunState, kind: str, name: str, generation: int,
                        timeout: float) -> list[int]:
    """The members that never reached a gather that timed out; raises if every member did."""
    missing = state.gathers.missing(f"{kind}/{name}", state.members.keys())
    if not missing:
        raise RendezvousTimeoutError(f"{kind} {name!r} of generation {generation} timed out "
                                     f"after {timeout:g} s with every member in it")
    return missing


def join_timeout_message(state: RunState, node: Node, timeout: float) -> str:
    """Why no generation took the node in within its join's timeout, and what to do."""
    if state.phase == Phase.FORMING and state.generation == 0:
        return (f"no generation formed within {timeout:g} s: {len(state.waiting)} node(s) "
                f"joined, min_nodes={state.min_nodes}; start more nodes or lower min_nodes")
    if state.phase == Phase.FORMING:
        return (f"run {state.run_id!r} is below min_nodes ({len(state.waiting)} of "
                f"{state.min_nodes}) and no generation formed within {timeout:g} s; start "
                f"more nodes (the run fails after --below_min_timeout)")
    return (f"node {node.node_id} is waiting to be admitted: generation {state.generation} "
            f"has {len(state.members)} of max_nodes={state.max_nodes} members and has not "
            f"re-formed within {timeout:g} s. Waiting nodes are admitted when a member "
            f"leaves or fails, or when the members re-join to grow; join again to keep "
            f"waiting")


def _not_reached(what: str, generation: int, verb: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{what} does not exist yet (the current generation is {generation}); {verb} the "
        f"generation your last join returned")
