"""How the orchestrator scales: N simulated nodes join, heartbeat, watch; one dies.

Starts a real orchestrator process and a few client processes, each
simulating N/P light nodes on one asyncio gRPC channel. Every node joins at
once, opens a Watch stream (naming the member map its join returned, so its updates
are deltas) and heartbeats. Measured:

* rendezvous_s: from the last join sent to every node released with the
  generation (max_nodes = N, so the last call never applies);
* heartbeat_p50_ms / heartbeat_p99_ms: heartbeat round trips over a steady
  window (client side, so client scheduling delay counts against us), at
  heartbeat_interval_s, the interval the nodes beat at (the longer of
  --heartbeat_interval and the one the join replies asked for);
* beat_sent_late_p99_ms / beat_sent_late_max_ms: how late the clients sent their beats in
  that window (past each beat's due time), and whole_run_worst_s per client process: the
  latest beat and the slowest reply of the whole run, start-up included; with clients_cpu
  they show the clients' own scheduling delay;
* orchestrator_cpu: the orchestrator process's CPU time over the same window
  divided by its length (1.0 = one core busy; from /proc, so only for an
  orchestrator this script started);
* reform_after_kill_s: one node dies (stops heartbeating and drops its Watch
  stream, as a killed process does); from the moment this script orders the
  death to the moment every survivor's Watch shows the next generation,
  whichever way the orchestrator detected it (a broken watch, the heartbeat
  timeout); ``detected_by`` is the orchestrator's reason. Both ends are read
  on this script's monotonic clock, so the figure cannot be negative; it
  includes a pipe message or two (well under a millisecond) on top.
  ``reform_first_seen_s``: to the moment the first survivor's Watch showed it (the
  detection and the decision; the rest is the update's way to every watch).
  ``reform_cpu``: the CPU the orchestrator and the client processes spent over the same
  span (on one machine they share its cores: the clients' reading of every watch stream
  counts against the orchestrator's writes).

The simulated nodes ask for packed member maps, as Client does, and read only the head of
their join replies (their ids, the map's name and the interval asked for): a real node
unpacks one member map on its own host, 10,000 of them unpacked here would take the machine
from the orchestrator. With ``--soak_minutes``, a live
node removed after its own client left a gap longer than the run's timeout between two of
its beats counts as ``removed_while_client_late``, not as a false removal: the clients'
lateness says nothing of the orchestrator.

With ``--joins launcher`` the nodes of each launcher (``--nodes_per_stream``) join in one
JoinMany call, as restart mode's agent joins the nodes of its workers (the workers of an
in-process elastic job join from their own processes, one Join each: the default).

With ``--store etcd`` the same figures come for one orchestrator with a
state directory and for two replicas on a local etcd (the leader measured),
and ``failover_s``: the etcd leader killed -9, to the first call that
succeeds through the new leader.

The last line printed is the JSON result.

    python benchmarks/orchestrator_scale.py --nodes 1000
    python benchmarks/orchestrator_scale.py --nodes 1000 --store etcd
    python benchmarks/orchestrator_scale.py --nodes 10000 --nodes_per_stream 8 --joins launcher
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time

from typing import Callable

from harness import Orchestrator, cpu_seconds, exit_on_sigterm, percentile, status_mb

from tensorflow_elastic.rendezvous.settings import (
    HEARTBEAT_INTERVAL_S, RunSettings, liveness_timeout)

RUN_ID = "bench"
# Watch streams the client processes open per second together, as processes that start at
# different moments open theirs: thousands of new streams at once make gRPC cancel some of them
# (at main too). Beats start within one interval.
WATCHES_OPENED_PER_S = 500


def _join_head_classes() -> tuple[type, type]:
    """Messages that read a JoinResponse's node id, interval and map name, and skip its
    member map (and a JoinManyResponse made of such replies): a real node parses one map on its
    own host, while 10,000 maps of 10,000 members parsed here (4 ms each) would take this
    machine's cores from the orchestrator."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="bench_join_head.proto", package="bench",
                                              syntax="proto3")
    name = file.message_type.add(name="MapName")  # Membership's fields 1 and 4
    name.field.add(name="generation", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    name.field.add(name="digest", number=4, type=field.TYPE_FIXED64, label=field.LABEL_OPTIONAL)
    head = file.message_type.add(name="JoinHead")  # JoinResponse's fields 1, 2 and 4
    head.field.add(name="node_id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    head.field.add(name="membership", number=2, type=field.TYPE_MESSAGE,
                   type_name=".bench.MapName", label=field.LABEL_OPTIONAL)
    head.field.add(name="heartbeat_interval_s", number=4, type=field.TYPE_DOUBLE,
                   label=field.LABEL_OPTIONAL)
    answer = file.message_type.add(name="AnswerHead")  # JoinAnswer's fields 1-3
    answer.field.add(name="reply", number=1, type=field.TYPE_MESSAGE,
                     type_name=".bench.JoinHead", label=field.LABEL_OPTIONAL)
    answer.field.add(name="code", number=2, type=field.TYPE_INT32, label=field.LABEL_OPTIONAL)
    answer.field.add(name="message", number=3, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    many = file.message_type.add(name="JoinManyHead")  # JoinManyResponse
    many.field.add(name="answers", number=1, type=field.TYPE_MESSAGE,
                   type_name=".bench.AnswerHead", label=field.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"bench.{name}"))
                 for name in ("JoinHead", "JoinManyHead"))


async def _simulate(conn, endpoint: str, indices: list[int], nodes: int, interval: float,
                    timeout: float, liveness: str, per_stream: int, watches: str, processes: int,
                    map_per_launcher: bool, joins_per_call: bool) -> None:
    """One client process: its nodes, driven by commands from the parent over ``conn``.

    ``joins_per_call``: the nodes of one launcher (``per_stream`` nodes) join in one JoinMany
    call, as restart mode's agent joins its workers' nodes; otherwise each node calls Join.

    ``watches`` "node": every node holds a Watch stream (as elastic workers do); "launcher":
    only the first node of each stream does (a launcher's view; its agent reports deaths).

    ``liveness`` "unary": each node sends a Heartbeat call per interval; "stream": nodes beat
    on KeepAlive streams, ``per_stream`` nodes per stream (more than one: the workers of a
    launcher, whose agent reports a worker's death at once).
    """
    import grpc

    from tensorflow_elastic.proto import rendezvous_pb2 as pb
    from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
    from tensorflow_elastic.rpc import UNREACHABLE_OR_SHED

    shed = UNREACHABLE_OR_SHED
    reply_timeout = 10.0  # Client's default call_timeout
    transient = (*shed, grpc.StatusCode.DEADLINE_EXCEEDED)
    loop = asyncio.get_running_loop()

    async def command():
        return await loop.run_in_executor(None, conn.recv)

    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    channel = grpc.aio.insecure_channel(endpoint, options=options)
    stub = pb_grpc.RendezvousStub(channel)
    join_head, join_many_head = _join_head_classes()
    join_call = channel.unary_unary("/tensorflow_elastic.Rendezvous/Join",
                                    request_serializer=pb.JoinRequest.SerializeToString,
                                    response_deserializer=join_head.FromString)
    join_many_call = channel.unary_unary("/tensorflow_elastic.Rendezvous/JoinMany",
                                         request_serializer=pb.JoinManyRequest.SerializeToString,
                                         response_deserializer=join_many_head.FromString)
    await channel.channel_ready()
    # Beats on a connection of their own, as Client's KeepAlive stream: memberships sent to
    # thousands of watches must not hold them up in one connection's flow control.
    beat_channel = grpc.aio.insecure_channel(
        endpoint, options=[*options, ("grpc.use_local_subchannel_pool", 1)])
    beat_stub = pb_grpc.RendezvousStub(beat_channel)

    async def join(i: int, omit_members: bool = False):
        """A new node; retried with its nonce while the orchestrator sheds it, as Client does.
        It names the latest map this process holds (its reply is then a delta), or with
        ``omit_members`` asks for the map's name alone (another node of its launcher fetches
        the map)."""
        sent = time.time()
        r = await call_retried(join_call, join_request(i, omit_members))
        return took(r), sent, time.time()

    def join_request(i: int, omit_members: bool) -> pb.JoinRequest:
        return pb.JoinRequest(
            run_id=RUN_ID, address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:2222",
            min_nodes=max(1, nodes // 2), max_nodes=nodes, nonce=f"n{i}", timeout_s=600,
            known_map=latest_map(), omit_members=omit_members, packed_maps=True)

    async def call_retried(call, request):
        while True:
            try:
                return await call(request, timeout=610)
            except grpc.aio.AioRpcError as e:
                if e.code() not in shed:
                    raise
                join_retries.append(e.code().name)
                await asyncio.sleep(random.uniform(0.0, 0.5))

    def took(r) -> int:
        """A join reply read: the map the node now holds, the interval asked for."""
        maps[r.node_id] = pb.KnownMap(generation=r.membership.generation,
                                      digest=r.membership.digest)
        # As Client: the orchestrator of a large run asks for slower beats.
        beat_every["s"] = max(interval, r.heartbeat_interval_s)
        return r.node_id

    async def join_in_one_call(group: list[int]):
        """The nodes of one launcher in one JoinMany call: its first node gets the whole map
        (with ``--maps launcher``; else every node), the others its name."""
        sent = time.time()
        r = await call_retried(join_many_call, pb.JoinManyRequest(joins=[
            join_request(i, omit_members=map_per_launcher and k > 0)
            for k, i in enumerate(group)]))
        answered = time.time()
        refused = [a.message for a in r.answers if not a.HasField("reply")]
        if refused:
            raise RuntimeError(f"{len(refused)} joins of a launcher refused: {refused[0]}")
        joined = [(took(a.reply), sent, answered) for a in r.answers]
        start([node_id for node_id, _, _ in joined])
        return joined

    def latest_map() -> pb.KnownMap | None:
        return max(maps.values(), key=lambda m: m.generation, default=None)

    async def join_launcher(group: list[int]):
        """The nodes of one launcher join together, as an agent's workers: the first one gets
        the whole map, the others its name alone, and they beat as soon as they know their
        ids (``--maps launcher``); otherwise every node gets the whole map."""
        if joins_per_call:
            return await join_in_one_call(group)
        if not map_per_launcher or latest_map() is not None:
            joined = await asyncio.gather(*(join(i) for i in group))
            start([node_id for node_id, _, _ in joined])
            return joined
        known: list[int] = []
        beating: list[asyncio.Task] = []

        async def member(i: int, carrier: bool):
            node_id, sent, answered = await join(i, omit_members=not carrier)
            known.append(node_id)
            if not beating:  # the launcher beats for the ids it knows from here on
                beating.append(start_beats(known, 0, 1))
            return node_id, sent, answered

        joined = await asyncio.gather(*(member(i, k == 0) for k, i in enumerate(group)))
        map_at = joined[0][2]  # the launcher's map arrives with its first node's reply
        start_watches(known)
        return [(node_id, sent, max(answered, map_at)) for node_id, sent, answered in joined]

    join_retries: list[str] = []
    # The member map each node holds (from its join, then its watch): watches name it, so the
    # orchestrator sends what changed (clients of an orchestrator without deltas ignore it).
    maps: dict[int, pb.KnownMap] = {}
    watch_pace = {"next": 0.0}  # when the next watch of this process may open (loop time)
    beat_every = {"s": interval}  # the heartbeat interval, as the join replies ask for it
    measuring = {"on": False}
    early = {"reform": False}
    latencies: list[float] = []
    # How late each beat was sent (ms past its due time): the clients' own scheduling delay.
    lateness: list[float] = []
    # Over the whole run, start-up included: the latest beat sent and the slowest reply (s).
    worst = {"late": 0.0, "reply": 0.0}
    killed: set[int] = set()
    replaced: set[int] = set()  # killed on purpose in the soak: their removal is expected
    refused: dict[int, str] = {}  # node -> why the orchestrator refused its beats
    # The longest gap (s) between two beats sent for each node: a node removed after its client
    # left a gap longer than the run's timeout was removed for the client's lateness, which says
    # nothing of the orchestrator.
    send_gap: dict[int, float] = {}
    seen: dict[int, str] = {}
    seen_at: dict[str, float] = {}  # when this process's first watch saw the next generation
    all_seen = asyncio.Event()
    generation = {"now": 1}
    watch_errors: list[str] = []
    beat_errors: list[str] = []
    watch_tasks: dict[int, asyncio.Task] = {}
    # Watches of killed nodes: the survivors' are the others (counted, not recomputed per update:
    # a set difference per update is 10,000 x 1,250 steps in a re-form at 10,000 nodes).
    watches_killed = {"n": 0}
    beat_tasks: dict[int, asyncio.Task] = {}

    def note_gap(nodes: list[int], gap: float) -> None:
        for node_id in nodes:
            send_gap[node_id] = max(send_gap.get(node_id, 0.0), gap)

    def client_late(node_id: int) -> bool:
        return send_gap.get(node_id, 0.0) > liveness_timeout(timeout, beat_every["s"])

    def note_reply(node_id: int, info) -> None:
        if info.generation > 1 and not killed:
            early["reform"] = True

    async def unary(node_id: int, k: int, count: int) -> None:
        await asyncio.sleep(beat_every["s"] * k / count)
        next_at = loop.time()
        sent_at = None
        while node_id not in killed:
            if measuring["on"]:
                lateness.append((loop.time() - next_at) * 1000)
            if sent_at is not None:
                note_gap([node_id], loop.time() - sent_at)
            sent_at = loop.time()
            t0 = time.perf_counter()
            try:
                reply = await stub.Heartbeat(pb.HeartbeatRequest(
                    run_id=RUN_ID, node_id=node_id, generation=1), timeout=30)
            except grpc.aio.AioRpcError as e:  # like Client: sent again at the next interval
                if e.code() not in transient:
                    refused[node_id] = e.details()
                    return
                beat_errors.append(f"{e.code().name}: {e.details()}")
            else:
                note_reply(node_id, reply)
                if measuring["on"]:
                    latencies.append((time.perf_counter() - t0) * 1000)
            next_at += beat_every["s"]
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def stream(group: list[int], k: int, count: int) -> None:
        """One KeepAlive stream beating for ``group`` (like a launcher's agent). As Client's
        stream, a message goes out every interval whether or not the last one was answered,
        and a stream that answered nothing for ``reply_timeout`` is opened again."""
        await asyncio.sleep(beat_every["s"] * k / count)
        last_sent, longest = None, 0.0
        while True:
            call = beat_stub.KeepAlive()
            sent_at: collections.deque[float] = collections.deque()
            reader = loop.create_task(answers(call, sent_at))
            next_at = loop.time()
            try:
                while not reader.done():
                    beats = [pb.HeartbeatRequest(run_id=RUN_ID, node_id=n, generation=1)
                             for n in group if n not in killed and n not in refused]
                    if not beats:
                        await call.done_writing()
                        return
                    if sent_at and time.perf_counter() - sent_at[0] > reply_timeout:
                        raise asyncio.TimeoutError
                    late = loop.time() - next_at
                    if last_sent is not None and loop.time() - last_sent > longest:
                        longest = loop.time() - last_sent
                        note_gap(group, longest)
                    last_sent = loop.time()
                    worst["late"] = max(worst["late"], late)
                    if measuring["on"]:
                        lateness.append(late * 1000)
                    sent_at.append(time.perf_counter())
                    await call.write(pb.KeepAliveRequest(beats=beats))
                    next_at += beat_every["s"]
                    await asyncio.sleep(max(0.0, next_at - loop.time()))
                reader.result()  # the stream ended: its error, if any
            except grpc.aio.AioRpcError as e:
                beat_errors.append(f"beat {e.code().name}: {e.details()}")
                await asyncio.sleep(0.05)
            except asyncio.TimeoutError:
                beat_errors.append(f"beat: no reply within {reply_timeout:g} s")
                call.cancel()
            finally:
                reader.cancel()

    async def answers(call, sent_at: collections.deque[float]) -> None:
        """Reads a KeepAlive stream's replies, each to the oldest message not yet answered."""
        while True:
            response = await call.read()
            if response is grpc.aio.EOF:
                return
            round_trip = time.perf_counter() - sent_at.popleft()
            for answer in response.answers:
                if answer.HasField("info"):
                    note_reply(answer.node_id, answer.info)
                else:
                    refused[answer.node_id] = answer.message
            worst["reply"] = max(worst["reply"], round_trip)
            if measuring["on"]:
                latencies.append(round_trip * 1000)

    async def watch(node_id: int) -> None:
        # Like Client.watch: a broken stream is opened again (it restarts with the current state).
        # Opened at the pace of WATCHES_OPENED_PER_S over the client processes.
        opens_at = max(loop.time(), watch_pace["next"])
        watch_pace["next"] = opens_at + processes / WATCHES_OPENED_PER_S
        await asyncio.sleep(opens_at - loop.time())
        while True:
            try:
                async for update in stub.Watch(pb.WatchRequest(
                        run_id=RUN_ID, node_id=node_id, known_map=maps.get(node_id),
                        packed_maps=True)):
                    maps[node_id] = pb.KnownMap(generation=update.membership.generation,
                                                digest=update.membership.digest)
                    if update.membership.generation > generation["now"]:
                        seen_at.setdefault("first", time.monotonic())
                        seen[node_id] = update.reason
                        if len(seen) >= len(watch_tasks) - watches_killed["n"]:
                            all_seen.set()
            except grpc.aio.AioRpcError as e:
                watch_errors.append(f"watch {e.code().name}: {e.details()}")
                await asyncio.sleep(0.05)

    def start(new_ids: list[int]) -> None:
        groups = ([new_ids[g:g + per_stream] for g in range(0, len(new_ids), per_stream)]
                  if liveness == "stream" else [[node_id] for node_id in new_ids])
        start_watches(new_ids)
        for k, group in enumerate(groups):
            start_beats(group, k, len(groups))

    def start_watches(new_ids: list[int]) -> None:
        watching = [node_id for g in range(0, len(new_ids), per_stream)
                    for node_id in (new_ids[g:g + 1] if watches == "launcher"
                                    else new_ids[g:g + per_stream])]
        for node_id in watching:
            watch_tasks[node_id] = loop.create_task(watch(node_id))

    def start_beats(group: list[int], k: int, count: int) -> asyncio.Task:
        """Beats for ``group`` (a list that may grow: ids added are beaten for too)."""
        beat = stream(group, k, count) if liveness == "stream" else unary(group[0], k, count)
        task = loop.create_task(beat)
        for node_id in group:
            beat_tasks[node_id] = task
        return task

    async def kill(victims: list[int]) -> None:
        """Dead from here on: no more beats, the stream gone; a launcher reports it at once."""
        killed.update(victims)
        for node_id in victims:
            if node_id in watch_tasks:
                watch_tasks[node_id].cancel()
                watches_killed["n"] += 1
            if liveness == "unary":
                beat_tasks[node_id].cancel()  # a shared beat stream leaves it out
        if liveness == "stream" and per_stream > 1:
            await asyncio.gather(*(stub.ReportFailure(pb.ReportFailureRequest(
                run_id=RUN_ID, node_id=node_id, peers=[node_id], reason="exited with -9"),
                timeout=30) for node_id in victims))

    assert await command() == "join"
    launchers = [indices[g:g + per_stream] for g in range(0, len(indices), per_stream)]
    joined = [j for group in await asyncio.gather(*(join_launcher(g) for g in launchers))
              for j in group]
    ids = [j[0] for j in joined]
    conn.send(([(sent, released) for _, sent, released in joined], time.process_time()))
    await asyncio.sleep(max(interval, watch_pace["next"] - loop.time()))
    conn.send("running")
    cpu_at = reform_cpu_at = time.process_time()
    next_index = nodes + indices[0]  # newcomers' indices: this process's, past every node's
    while True:
        cmd = await command()
        if cmd == "measure":
            measuring["on"] = True
            cpu_at = time.process_time()
        elif cmd == "stop_measure":
            measuring["on"] = False
            conn.send((latencies, early["reform"], list(watch_errors) + beat_errors,
                       time.process_time() - cpu_at, len(join_retries), lateness,
                       sorted(refused.items())[:5], dict(worst), len(refused), beat_every["s"],
                       sum(client_late(n) for n in refused)))
        elif isinstance(cmd, tuple) and cmd[0] == "kill":
            reform_cpu_at = time.process_time()  # every client counts its CPU from the kill
            await kill(ids[:cmd[1]])
        elif cmd == "wait_reform":
            try:
                await asyncio.wait_for(all_seen.wait(), 120)
                conn.send((sorted(set(seen.values())), watch_errors, seen_at["first"],
                           time.process_time() - reform_cpu_at))
            except asyncio.TimeoutError:
                conn.send(f"{len(seen)} of {len(watch_tasks.keys() - killed)} watches saw it")
        elif isinstance(cmd, tuple) and cmd[0] == "replace":
            # Newcomers join (they wait), then as many members die: the re-form admits them.
            _, count, stride = cmd
            alive = [n for n in ids if n not in killed]
            victims = alive[:count]
            fresh = list(range(next_index, next_index + count * stride, stride))
            next_index += count * stride
            joining = [loop.create_task(join(i)) for i in fresh]
            await asyncio.sleep(1.0)
            replaced.update(victims)
            await kill(victims)
            new_ids = [node_id for node_id, _, _ in await asyncio.gather(*joining)]
            ids.extend(new_ids)
            start(new_ids)
            removed = sorted(n for n in refused if n not in replaced)
            false = [n for n in removed if not client_late(n)]
            conn.send((len(new_ids), false, [refused[n] for n in false[:3]],
                       time.process_time() - cpu_at, len(removed) - len(false)))
            cpu_at = time.process_time()
        elif cmd == "exit":
            break
    for task in [*watch_tasks.values(), *beat_tasks.values()]:
        task.cancel()
    await channel.close()
    await beat_channel.close()


def _client_process(conn, endpoint: str, indices: list[int], nodes: int, interval: float,
                    timeout: float, liveness: str, per_stream: int, watches: str, processes: int,
                    map_per_launcher: bool, joins_per_call: bool) -> None:
    asyncio.run(_simulate(conn, endpoint, indices, nodes, interval, timeout, liveness, per_stream,
                          watches, processes, map_per_launcher, joins_per_call))


def _start_orchestrator(args: argparse.Namespace, *flags: str) -> Orchestrator:
    """An orchestrator that never ends a rendezvous early (a long last call) and lets this one
    host hold every simulated node's watch stream."""
    watches = str(2 * args.nodes + 1000)
    return Orchestrator("--heartbeat_timeout", str(args.heartbeat_timeout), "--last_call", "600",
                        "--max_watches_per_peer", watches, "--max_watches", watches,
                        *flags, quiet=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100,
                        help="simulated nodes (default: %(default)s)")
    parser.add_argument("--processes", type=int, default=0,
                        help="client processes (default: 1 per 250 nodes, at most 8)")
    parser.add_argument("--heartbeat_interval", type=float, default=HEARTBEAT_INTERVAL_S,
                        help="seconds between two heartbeats of a node; the orchestrator of a "
                             "large run asks for a longer one in its join replies, and the nodes "
                             "then beat at that one, as Client does (default: %(default)s)")
    parser.add_argument("--heartbeat_timeout", type=float,
                        default=RunSettings.heartbeat_timeout,
                        help="the orchestrator's --heartbeat_timeout (default: %(default)s)")
    parser.add_argument("--measure_s", type=float, default=10.0,
                        help="seconds of steady heartbeats measured (default: %(default)s)")
    parser.add_argument("--endpoint", metavar="HOST:PORT",
                        help="use this running orchestrator (started with --heartbeat_timeout "
                             "as given here and a long --last_call) instead of starting one")
    parser.add_argument("--store", choices=("memory", "etcd"), default="memory",
                        help="etcd: also measure two replicas on a local etcd (the `etcd` "
                             "command), next to one orchestrator with --state_dir, and the "
                             "failover after the leader's kill -9 (default: memory only)")
    parser.add_argument("--liveness", choices=("stream", "unary"), default="stream",
                        help="how nodes heartbeat: stream (KeepAlive streams, as Client does) "
                             "or unary (a Heartbeat call per node and interval, as before; the "
                             "only way to an orchestrator without KeepAlive) "
                             "(default: %(default)s)")
    parser.add_argument("--nodes_per_stream", type=int, default=1,
                        help="--liveness stream: nodes beating on one stream; above 1 they are "
                             "the workers of one launcher, which reports a worker's death at "
                             "once (default: %(default)s)")
    parser.add_argument("--watches", choices=("node", "launcher"), default="node",
                        help="node: every node holds a Watch stream, as elastic workers do; "
                             "launcher: only one node per --nodes_per_stream group does (the "
                             "member map of every change goes to 1/N as many streams) "
                             "(default: %(default)s)")
    parser.add_argument("--maps", choices=("launcher", "node"), default="launcher",
                        help="launcher: the nodes of one --nodes_per_stream group join together "
                             "and the first one alone gets the whole member map (the others its "
                             "name, and they beat at once), as Client shares a map among the "
                             "nodes of its process; node: every join gets the whole map, as "
                             "before (default: %(default)s)")
    parser.add_argument("--joins", choices=("node", "launcher"), default="node",
                        help="node: every node joins with a Join call of its own, as the workers "
                             "of an in-process elastic job do; launcher: the nodes of one "
                             "--nodes_per_stream group join in one JoinMany call, as restart "
                             "mode's agent joins its workers' nodes (default: %(default)s)")
    parser.add_argument("--soak_minutes", type=int, default=0,
                        help="after the measurement, replace --replace_percent of the nodes "
                             "every minute for this long; report false removals and the "
                             "orchestrator's memory (default: no soak)")
    parser.add_argument("--replace_percent", type=float, default=1.0,
                        help="--soak_minutes: nodes replaced every minute, in percent "
                             "(default: %(default)s)")
    parser.add_argument("--leader_ttl", type=int, default=1,
                        help="--store etcd: the replicas' --leader_ttl (default: %(default)s)")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    if args.endpoint:
        result = _scale(args, args.endpoint)
    elif args.store == "etcd":
        result = _compare_stores(args)
    else:
        server = _start_orchestrator(args)
        try:
            result = _scale(args, server.endpoint, server)
        finally:
            server.stop()
    print(json.dumps(result))
    return 0


def _compare_stores(args: argparse.Namespace) -> dict:
    """The file store (one orchestrator, --state_dir) and etcd (two replicas) in one run, then
    the etcd leader killed -9: failover = from the kill to the first call that succeeds
    through the new leader (a client given both replicas, as workers are)."""
    from tensorflow_elastic.rendezvous import Client
    from tools.etcd_server import EtcdServer

    with tempfile.TemporaryDirectory() as tmp:
        server = _start_orchestrator(args, "--state_dir", os.path.join(tmp, "state"))
        try:
            file_result = _scale(args, server.endpoint, server)
        finally:
            server.stop()
        etcd = EtcdServer(os.path.join(tmp, "etcd")).start()
        replicas = []
        try:
            flags = ("--store", etcd.url, "--leader_ttl", str(args.leader_ttl))
            replicas.append(_start_orchestrator(args, *flags))
            time.sleep(1.0)  # the first one takes the lead
            replicas.append(_start_orchestrator(args, *flags))
            etcd_result = _scale(args, replicas[0].endpoint, replicas[0])
            endpoints = ",".join(r.endpoint for r in replicas)
            with Client(endpoints, RUN_ID, retry_timeout=60) as client:
                client.status()
                killed_at = time.monotonic()
                replicas[0].proc.kill()
                client.status()
                etcd_result["failover_s"] = round(time.monotonic() - killed_at, 4)
                etcd_result["new_leader"] = client.current_endpoint
        finally:
            for replica in replicas:
                replica.stop()
            etcd.stop()
    print(f"file store: {json.dumps(file_result)}", flush=True)
    print(f"etcd store: {json.dumps(etcd_result)}", flush=True)
    return {"nodes": args.nodes, "file": file_result, "etcd": etcd_result}


def _scale(args: argparse.Namespace, endpoint: str,
           server: Orchestrator | None = None) -> dict:
    """Joins, steady heartbeats and a re-form after one node's death, against ``endpoint``
    (``server``: its process, whose CPU use is measured)."""
    processes = args.processes or min(8, max(1, args.nodes // 250))
    ctx = mp.get_context("spawn")
    conns, workers = [], []
    try:
        for p in range(processes):
            parent, child = ctx.Pipe()
            indices = list(range(p, args.nodes, processes))
            worker = ctx.Process(target=_client_process, args=(
                child, endpoint, indices, args.nodes, args.heartbeat_interval,
                args.heartbeat_timeout, args.liveness,
                args.nodes_per_stream, args.watches, processes, args.maps == "launcher",
                args.joins == "launcher"),
                daemon=True)
            worker.start()
            conns.append(parent)
            workers.append(worker)

        def broadcast(cmd: object) -> list:
            for c in conns:
                c.send(cmd)
            return [c.recv() for c in conns]

        cpu_at_start = None if server is None else cpu_seconds(server.proc.pid)
        started = time.time()
        replies = broadcast("join")
        times = [t for reply, _ in replies for t in reply]
        rendezvous_s = max(r for _, r in times) - max(s for s, _ in times)
        formation = {"s": round(time.time() - started, 3),
                     "clients_cpu_s": round(sum(cpu for _, cpu in replies), 3),
                     "orchestrator_cpu_s": None if server is None else round(
                         cpu_seconds(server.proc.pid) - cpu_at_start, 3)}
        print(f"{args.nodes} nodes joined; rendezvous {rendezvous_s:.3f} s; formation "
              f"{formation}", flush=True)
        for c in conns:
            assert c.recv() == "running"
        time.sleep(2 * args.heartbeat_interval)  # warm up: every node heartbeats and watches
        cpu_before = None if server is None else (cpu_seconds(server.proc.pid), time.monotonic())
        for c in conns:
            c.send("measure")
        started = time.monotonic()
        time.sleep(args.measure_s)
        replies = broadcast("stop_measure")
        window = time.monotonic() - started
        cpu = None if cpu_before is None else round(
            (cpu_seconds(server.proc.pid) - cpu_before[0]) / (time.monotonic() - cpu_before[1]), 3)
        clients_cpu = round(sum(r[3] for r in replies) / window, 3)
        join_retries = sum(r[4] for r in replies)
        latencies = [x for r in replies for x in r[0]]
        lateness = [x for r in replies for x in r[5]]
        if any(r[1] for r in replies):
            failed = [e for r in replies for e in r[2]]
            raise RuntimeError(f"a node was declared dead before the kill: heartbeats were "
                               f"delayed beyond --heartbeat_timeout; the machine is overloaded "
                               f"({len(failed)} calls failed: {sorted(set(failed))[:5]}; "
                               f"clients' CPU "
                               f"{clients_cpu}, beats sent late by up to "
                               f"{max(lateness, default=0):.0f} ms in the window; whole run: "
                               f"{[r[7] for r in replies]}; {sum(r[8] for r in replies)} "
                               f"({sum(r[10] for r in replies)} after their client left a "
                               f"gap longer than the run's timeout between two beats) "
                               f"refused: {[x for r in replies for x in r[6]][:3]})")
        print(f"{len(latencies)} heartbeats measured; clients' CPU {clients_cpu}", flush=True)
        cpu_at_kill = None if server is None else cpu_seconds(server.proc.pid)
        killed_at = time.monotonic()
        for k, c in enumerate(conns):
            c.send(("kill", 1 if k == 0 else 0))  # one node dies
        reformed = broadcast("wait_reform")
        reform_s = time.monotonic() - killed_at
        if any(isinstance(r, str) for r in reformed):
            raise RuntimeError(f"survivors did not all see the next generation within 120 s: "
                               f"{[r for r in reformed if isinstance(r, str)]}")
        # Where the machine's time went from the kill to the last survivor's update: the
        # orchestrator's writes or the client processes' reads of 9,999 streams (same cores).
        reform_cpu = {"orchestrator_s": None if server is None else round(
                          cpu_seconds(server.proc.pid) - cpu_at_kill, 3),
                      "clients_s": round(sum(r[3] for r in reformed), 3)}
        detected_by = sorted({reason for reasons, _, _, _ in reformed for reason in reasons})
        errors = [e for _, errs, _, _ in reformed for e in errs]
        # The first watch to see the next generation: the orchestrator's detection and decision;
        # the rest of reform_after_kill_s is the update's way to 9,999 watches.
        first_seen_s = min(first for _, _, first, _ in reformed) - killed_at
        if errors:
            print(f"{len(errors)} watch streams broke and were opened again: "
                  f"{sorted(set(errors))[:3]}", flush=True)
        soak = _soak(args, broadcast, processes, server) if args.soak_minutes else None
        for c in conns:
            c.send("exit")
        for w in workers:
            w.join(timeout=30)
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
    result = {"nodes": args.nodes, "liveness": args.liveness,
              "nodes_per_stream": args.nodes_per_stream if args.liveness == "stream" else None,
              "watches": args.watches, "maps": args.maps, "joins": args.joins,
              "processes": processes, "rendezvous_s": round(rendezvous_s, 4),
              "formation": formation,
              "join_retries": join_retries,
              "heartbeat_p50_ms": round(percentile(latencies, 50), 3),
              "heartbeat_p99_ms": round(percentile(latencies, 99), 3),
              "heartbeat_interval_s": max(r[9] for r in replies), "orchestrator_cpu": cpu,
              "clients_cpu": clients_cpu,
              "beat_sent_late_p99_ms": round(percentile(lateness, 99), 3),
              "beat_sent_late_max_ms": round(max(lateness), 3),
              "whole_run_worst_s": [{k: round(v, 3) for k, v in r[7].items()} for r in replies],
              "reform_after_kill_s": round(reform_s, 4),
              "reform_first_seen_s": round(first_seen_s, 4),
              "reform_cpu": reform_cpu,
              "detected_by": detected_by}
    if soak is not None:
        result["soak"] = soak
    return result


def _soak(args: argparse.Namespace, broadcast: Callable[[object], list], processes: int,
          server: Orchestrator | None) -> dict:
    """Every minute --replace_percent of the nodes are replaced (newcomers join, as many members
    die); counts the live nodes the orchestrator removed (those whose client had left a gap
    longer than the run's timeout between two beats apart) and samples its memory."""
    minutes = []
    false_removals: list[int] = []
    for minute in range(args.soak_minutes):
        started = time.monotonic()
        count = max(1, round(args.nodes * args.replace_percent / 100 / processes))
        replies = broadcast(("replace", count, processes))
        took = time.monotonic() - started
        false_removals = sorted({n for r in replies for n in r[1]})
        rss = None if server is None else status_mb(server.proc.pid, "VmRSS")
        cpu = None if server is None else cpu_seconds(server.proc.pid)
        time.sleep(max(0.0, 60.0 - (time.monotonic() - started)))
        minute_s = time.monotonic() - started
        sample = {"minute": minute + 1, "replaced": sum(r[0] for r in replies),
                  "replace_s": round(took, 3), "false_removals": len(false_removals),
                  "removed_while_client_late": sum(r[4] for r in replies),
                  "orchestrator_rss_mb": None if rss is None else round(rss, 1),
                  "clients_cpu": round(sum(r[3] for r in replies) / minute_s, 3)}
        if server is not None:
            sample["orchestrator_cpu"] = round((cpu_seconds(server.proc.pid) - cpu) / (
                minute_s - took), 3)
        minutes.append(sample)
        print(f"soak: {json.dumps(sample)}", flush=True)
        if false_removals:
            print(f"soak: live nodes removed: {false_removals[:10]}: "
                  f"{[m for r in replies for m in r[2]][:3]}", flush=True)
    return {"minutes": args.soak_minutes, "replace_percent": args.replace_percent,
            "false_removals": len(false_removals),
            "removed_while_client_late": minutes[-1]["removed_while_client_late"] if minutes else 0,
            "rss_mb": [m["orchestrator_rss_mb"] for m in minutes], "per_minute": minutes}


if __name__ == "__main__":
    sys.exit(main())
