"""One heartbeat stream per process and orchestrator: the beats of all its nodes in one message.

A unary Heartbeat per node and interval costs the orchestrator a call each
(about 0.2 ms of its one core): 1,000 nodes beating every 0.25 s fill it. The
nodes of one process (an agent's workers, a benchmark's simulated nodes) share
a :class:`KeepAliveStream` instead: every interval it sends one message naming
each node and its generation, and the orchestrator answers with the nodes
whose answer changed. Each node still sees a reply per beat (the last answer
it got) and its heartbeats still end when the orchestrator refuses them, so a
node's owner cannot tell the difference from unary heartbeats.

The stream is opened through a client that follows the leading replica and
retries while none answers; an orchestrator that does not know the method
(UNIMPLEMENTED) makes every node fall back to unary heartbeats.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from typing import Callable, Hashable, Iterator

import grpc

from tensorflow_elastic import rpc
from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.rendezvous.errors import RendezvousError
from tensorflow_elastic.rendezvous.types import HeartbeatInfo, Phase

logger = logging.getLogger(__name__)

# The longest pause before a stream that keeps failing is opened again: well within the
# heartbeat timeout, so a node is heard again soon after its orchestrator is back.
REOPEN_MAX_S = 0.5
# Beats that failed with these are simply sent again at the next interval.
TRANSIENT = (*rpc.UNREACHABLE_OR_SHED, grpc.StatusCode.DEADLINE_EXCEEDED)

# Opens the stream: given a factory of request iterators, returns the responses.
Opener = Callable[[Callable[[], Iterator[pb.KeepAliveRequest]]], Iterator[pb.KeepAliveResponse]]


@dataclasses.dataclass(eq=False)
class Beat:
    """One node beating on a shared stream, and what its owner hears."""

    run_id: str
    node_id: int
    # The node's generation, read when each message is sent.
    generation: Callable[[], int]
    on_reply: Callable[[HeartbeatInfo], None] | None
    # Called once when the orchestrator refuses the node's beats for good (removed, run failed).
    on_stop: Callable[[Exception], None]
    # Called once when the orchestrator does not serve KeepAlive: beat another way.
    on_unsupported: Callable[[], None]
    error: Exception | None = None
    info: HeartbeatInfo | None = None


class KeepAliveStream:
    """The beats of a process's nodes to one orchestrator, every ``interval`` seconds.

    A reply that does not come within ``reply_timeout`` (an orchestrator that
    hangs) ends the stream with DEADLINE_EXCEEDED, and it is opened again.
    """

    def __init__(self, open_stream: Opener, interval: float, reply_timeout: float,
                 on_idle: Callable[["KeepAliveStream"], None], first: Beat):
        self._open = open_stream
        self._interval = interval
        self._reply_timeout = reply_timeout
        self._on_idle = on_idle
        self._lock = threading.Lock()
        self._beats: dict[tuple[str, int], Beat] = {(first.run_id, first.node_id): first}
        self._wake = threading.Event()
        self.closed = False
        self._thread = threading.Thread(target=self._loop, name="tfelastic-keepalive",
                                        daemon=True)
        self._thread.start()

    def add(self, beat: Beat) -> bool:
        """Beats for ``beat`` from now on; False once the stream has ended (make another)."""
        with self._lock:
            if self.closed:
                return False
            self._beats[beat.run_id, beat.node_id] = beat
            return True

    def remove(self, beat: Beat) -> None:
        with self._lock:
            if self._beats.get((beat.run_id, beat.node_id)) is beat:
                del self._beats[beat.run_id, beat.node_id]
        self._wake.set()

    # ------------------------------------------------------------------ internals

    def _loop(self) -> None:
        backoff = rpc.FIRST_BACKOFF_S
        while True:
            with self._lock:
                if not self._beats:
                    self.closed = True
                    break
            stream = _Exchange(self)
            try:
                stream.call = self._open(stream.requests)
                for response in stream.call:
                    stream.answered(response)
            except RendezvousError as e:
                if e.code == grpc.StatusCode.UNIMPLEMENTED:
                    self._unsupported()
                    break
                self._failed(stream.no_reply or e)
            except grpc.RpcError as e:
                self._failed(stream.no_reply or rpc.rebuild_error(e, RendezvousError))
            except Exception as e:  # noqa: BLE001 - the beats' owners must hear why
                logger.exception("the heartbeat stream to the orchestrator failed")
                self._failed(e)
            finally:
                stream.end()
            # Opened again soon, at a random moment: the processes whose streams broke together
            # (an orchestrator restart) must not all come back in one burst.
            backoff = rpc.FIRST_BACKOFF_S if stream.replied else min(2 * backoff, REOPEN_MAX_S)
            self._wake.wait(random.uniform(0.0, backoff))
            self._wake.clear()
        self._on_idle(self)

    def _unsupported(self) -> None:
        with self._lock:
            self.closed = True
            beats, self._beats = list(self._beats.values()), {}
        for beat in beats:
            beat.on_unsupported()

    def _failed(self, error: Exception) -> None:
        """The stream broke: every node's last heartbeat failed. It is sent again, unless the
        orchestrator refused the stream itself (a wrong token): then every node's heartbeats
        end, as its calls would."""
        beats = self._current()
        for beat in beats:
            beat.error = error
        if isinstance(error, RendezvousError) and error.code not in TRANSIENT:
            for beat in beats:
                self.remove(beat)
                beat.on_stop(error)

    def _current(self) -> list[Beat]:
        with self._lock:
            return list(self._beats.values())

    def _answer(self, sent: list[Beat], response: pb.KeepAliveResponse) -> None:
        by_key = {(b.run_id, b.node_id): b for b in sent}
        refused = set()
        for answer in response.answers:
            beat = by_key.get((answer.run_id, answer.node_id))
            if beat is None:
                continue
            if answer.HasField("info"):
                beat.info = info_from_proto(answer.info)
                continue
            refused.add(beat)
            error = RendezvousError.from_answer(answer.code, answer.message, answer.reason)
            beat.error = error
            if error.code not in TRANSIENT:
                self.remove(beat)  # removed, run failed, ...: more beats cannot help
                beat.on_stop(error)
        for beat in sent:
            if beat in refused or beat.info is None:
                continue
            beat.error = None
            if beat.on_reply is not None:
                try:
                    beat.on_reply(beat.info)
                except Exception:  # noqa: BLE001 - a listener's bug must not silence the node
                    logger.exception("heartbeat listener failed; heartbeats go on")


class _Exchange:
    """One opening of the stream: the requests it sends, and the replies it expects."""

    def __init__(self, stream: KeepAliveStream):
        self._stream = stream
        self._sent: list[list[Beat]] = []
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._last_reply = time.monotonic()
        self._replied = False
        # The open stream (with cancel()), once its first reply came.
        self.call: object | None = None
        # Set when replies stopped coming and the stream was cancelled for it.
        self.no_reply: RendezvousError | None = None

    def requests(self) -> Iterator[pb.KeepAliveRequest]:
        """The messages of one attempt to open the stream: one at once, then every interval."""
        stream = self._stream
        with self._lock:  # an attempt retried after a failure starts with a clean slate
            self._sent.clear()
            self._last_reply = time.monotonic()
        while not self._ended.is_set():
            beats = stream._current()
            if not beats:
                return
            with self._lock:
                silent = time.monotonic() - self._last_reply
                if self._sent and silent > stream._reply_timeout:
                    self.no_reply = RendezvousError(
                        f"the orchestrator answered no heartbeat for {silent:.1f} s",
                        code=grpc.StatusCode.DEADLINE_EXCEEDED)
                    if self.call is None:
                        raise self.no_reply  # gRPC cancels the call it could not feed
                    self.call.cancel()
                    return
                self._sent.append(beats)
            yield pb.KeepAliveRequest(beats=[
                pb.HeartbeatRequest(run_id=b.run_id, node_id=b.node_id,
                                    generation=b.generation()) for b in beats])
            stream._wake.wait(stream._interval)
            stream._wake.clear()

    @property
    def replied(self) -> bool:
        """Whether the orchestrator answered on this opening of the stream."""
        return self._replied

    def answered(self, response: pb.KeepAliveResponse) -> None:
        self._replied = True
        with self._lock:
            self._last_reply = time.monotonic()
            sent = self._sent.pop(0) if self._sent else []
        self._stream._answer(sent, response)

    def end(self) -> None:
        self._ended.set()


def info_from_proto(r: pb.HeartbeatResponse) -> HeartbeatInfo:
    return HeartbeatInfo(r.generation, Phase(pb.RunState.Name(r.state)), r.waiting, r.removed,
                         r.member, r.queued)


class Streams:
    """The process's streams, one per orchestrator and interval (``key``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[Hashable, KeepAliveStream] = {}

    def add(self, key: Hashable, beat: Beat,
            make: Callable[[Callable[[KeepAliveStream], None], Beat], KeepAliveStream]
            ) -> KeepAliveStream:
        """Beats for ``beat`` on the stream of ``key``; ``make(on_idle, beat)`` opens one for
        it if there is none."""
        with self._lock:
            stream = self._streams.get(key)
            if stream is None or not stream.add(beat):
                stream = make(lambda ended: self._forget(key, ended), beat)
                self._streams[key] = stream
            return stream

    def _forget(self, key: Hashable, stream: KeepAliveStream) -> None:
        with self._lock:
            if self._streams.get(key) is stream:
                del self._streams[key]


STREAMS = Streams()
