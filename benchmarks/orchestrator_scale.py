"""How the orchestrator scales: N simulated nodes join, heartbeat, watch; one dies.

Starts a real orchestrator process and a few client processes, each
simulating N/P light nodes on one asyncio gRPC channel. Every node joins at
once, opens a Watch stream and heartbeats once a second. Measured:

* rendezvous_s: from the last join sent to every node released with the
  generation (max_nodes = N, so the last call never applies);
* heartbeat_p50_ms / heartbeat_p99_ms: heartbeat round trips over a steady
  window (client side, so client scheduling delay counts against us);
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

With ``--store etcd`` the same figures come for one orchestrator with a
state directory and for two replicas on a local etcd (the leader measured),
and ``failover_s``: the etcd leader killed -9, to the first call that
succeeds through the new leader.

The last line printed is the JSON result.

    python benchmarks/orchestrator_scale.py --nodes 1000
    python benchmarks/orchestrator_scale.py --nodes 1000 --store etcd
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time

from harness import Orchestrator, cpu_seconds, exit_on_sigterm, percentile

from tensorflow_elastic.rendezvous.settings import HEARTBEAT_INTERVAL_S, RunSettings

RUN_ID = "bench"


async def _simulate(conn, endpoint: str, indices: list[int], nodes: int, interval: float) -> None:
    """One client process: its nodes, driven by commands from the parent over ``conn``."""
    import grpc

    from tensorflow_elastic.proto import rendezvous_pb2 as pb
    from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc

    loop = asyncio.get_running_loop()

    async def command():
        return await loop.run_in_executor(None, conn.recv)

    channel = grpc.aio.insecure_channel(endpoint, options=[
        ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    stub = pb_grpc.RendezvousStub(channel)
    await channel.channel_ready()
    assert await command() == "join"

    async def join(i: int):
        sent = time.time()
        r = await stub.Join(pb.JoinRequest(
            run_id=RUN_ID, address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:2222",
            min_nodes=max(1, nodes // 2), max_nodes=nodes, nonce=f"n{i}", timeout_s=600),
            timeout=610)
        return r.node_id, r.membership.generation, sent, time.time()

    joined = await asyncio.gather(*(join(i) for i in indices))
    ids = [j[0] for j in joined]
    conn.send([(sent, released) for _, _, sent, released in joined])

    measuring = {"on": False}
    early = {"reform": False}
    latencies: list[float] = []
    killed: set[int] = set()
    seen: dict[int, str] = {}
    all_seen = asyncio.Event()

    async def heartbeat(k: int, node_id: int) -> None:
        await asyncio.sleep(interval * k / len(ids))
        next_at = loop.time()
        while node_id not in killed:
            t0 = time.perf_counter()
            try:
                reply = await stub.Heartbeat(pb.HeartbeatRequest(
                    run_id=RUN_ID, node_id=node_id, generation=1), timeout=30)
            except grpc.aio.AioRpcError as e:  # like Client: sent again at the next interval
                heartbeat_errors.append(f"{e.code().name}: {e.debug_error_string()}")
            else:
                if reply.generation > 1 and not killed:
                    early["reform"] = True
                if measuring["on"]:
                    latencies.append((time.perf_counter() - t0) * 1000)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def watch(node_id: int) -> None:
        # Like Client.watch: a broken stream is opened again (it restarts with the current state).
        while True:
            try:
                async for update in stub.Watch(pb.WatchRequest(run_id=RUN_ID, node_id=node_id)):
                    if update.membership.generation >= 2:
                        seen[node_id] = update.reason
                        if len(seen) == len(ids) - len(killed):
                            all_seen.set()
                        return
            except grpc.aio.AioRpcError as e:
                watch_errors.append(f"{e.code().name}: {e.debug_error_string()}")
                await asyncio.sleep(0.05)

    watch_errors: list[str] = []
    heartbeat_errors: list[str] = []
    watches = {node_id: loop.create_task(watch(node_id)) for node_id in ids}
    beats = [loop.create_task(heartbeat(k, node_id)) for k, node_id in enumerate(ids)]
    conn.send("running")
    while True:
        cmd = await command()
        if cmd == "measure":
            measuring["on"] = True
        elif cmd == "stop_measure":
            measuring["on"] = False
            conn.send((latencies, early["reform"], list(watch_errors) + heartbeat_errors))
        elif cmd == "kill":
            # Dead from here on: its heartbeat loop sends no more, its stream is gone.
            victim = ids[0]
            killed.add(victim)
            watches[victim].cancel()
            beats[0].cancel()
        elif cmd == "wait_reform":
            try:
                await asyncio.wait_for(all_seen.wait(), 120)
                conn.send((sorted(set(seen.values())), watch_errors))
            except asyncio.TimeoutError:
                conn.send(f"{len(seen)} of {len(ids) - len(killed)} nodes saw it")
        elif cmd == "exit":
            break
    for task in beats + list(watches.values()):
        task.cancel()
    await channel.close()


def _client_process(conn, endpoint: str, indices: list[int], nodes: int, interval: float) -> None:
    asyncio.run(_simulate(conn, endpoint, indices, nodes, interval))


def _start_orchestrator(heartbeat_timeout: float, *flags: str) -> Orchestrator:
    """An orchestrator that never ends a rendezvous early (a long last call)."""
    return Orchestrator("--heartbeat_timeout", str(heartbeat_timeout), "--last_call", "600",
                        *flags, quiet=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100,
                        help="simulated nodes (default: %(default)s)")
    parser.add_argument("--processes", type=int, default=0,
                        help="client processes (default: 1 per 250 nodes, at most 4)")
    parser.add_argument("--heartbeat_interval", type=float, default=HEARTBEAT_INTERVAL_S,
                        help="seconds between two heartbeats of a node (default: %(default)s)")
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
    parser.add_argument("--leader_ttl", type=int, default=1,
                        help="--store etcd: the replicas' --leader_ttl (default: %(default)s)")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    if args.endpoint:
        result = _scale(args, args.endpoint)
    elif args.store == "etcd":
        result = _compare_stores(args)
    else:
        server = _start_orchestrator(args.heartbeat_timeout)
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
        server = _start_orchestrator(args.heartbeat_timeout, "--state_dir",
                                     os.path.join(tmp, "state"))
        try:
            file_result = _scale(args, server.endpoint, server)
        finally:
            server.stop()
        etcd = EtcdServer(os.path.join(tmp, "etcd")).start()
        replicas = []
        try:
            flags = ("--store", etcd.url, "--leader_ttl", str(args.leader_ttl))
            replicas.append(_start_orchestrator(args.heartbeat_timeout, *flags))
            time.sleep(1.0)  # the first one takes the lead
            replicas.append(_start_orchestrator(args.heartbeat_timeout, *flags))
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
    processes = args.processes or min(4, max(1, args.nodes // 250))
    ctx = mp.get_context("spawn")
    conns, workers = [], []
    try:
        for p in range(processes):
            parent, child = ctx.Pipe()
            indices = list(range(p, args.nodes, processes))
            worker = ctx.Process(target=_client_process, args=(
                child, endpoint, indices, args.nodes, args.heartbeat_interval), daemon=True)
            worker.start()
            conns.append(parent)
            workers.append(worker)

        def broadcast(cmd: str) -> list:
            for c in conns:
                c.send(cmd)
            return [c.recv() for c in conns]

        times = [t for reply in broadcast("join") for t in reply]
        rendezvous_s = max(r for _, r in times) - max(s for s, _ in times)
        print(f"{args.nodes} nodes joined; rendezvous {rendezvous_s:.3f} s", flush=True)
        for c in conns:
            assert c.recv() == "running"
        time.sleep(2 * args.heartbeat_interval)  # warm up: every node heartbeats and watches
        cpu_before = None if server is None else (cpu_seconds(server.proc.pid), time.monotonic())
        for c in conns:
            c.send("measure")
        time.sleep(args.measure_s)
        replies = broadcast("stop_measure")
        cpu = None if cpu_before is None else round(
            (cpu_seconds(server.proc.pid) - cpu_before[0]) / (time.monotonic() - cpu_before[1]), 3)
        if any(early for _, early, _ in replies):
            failed = [e for _, _, errors in replies for e in errors]
            raise RuntimeError(f"a node was declared dead before the kill: heartbeats were "
                               f"delayed beyond --heartbeat_timeout; the machine is overloaded "
                               f"({len(failed)} calls failed: {failed[:3]})")
        latencies = [x for lat, _, _ in replies for x in lat]
        print(f"{len(latencies)} heartbeats measured", flush=True)
        killed_at = time.monotonic()
        conns[0].send("kill")
        reformed = broadcast("wait_reform")
        reform_s = time.monotonic() - killed_at
        if any(isinstance(r, str) for r in reformed):
            raise RuntimeError(f"survivors did not all see the next generation within 120 s: "
                               f"{[r for r in reformed if isinstance(r, str)]}")
        detected_by = sorted({reason for reasons, _ in reformed for reason in reasons})
        errors = [e for _, errs in reformed for e in errs]
        if errors:
            print(f"{len(errors)} watch streams broke and were opened again: "
                  f"{sorted(set(errors))[:3]}", flush=True)
        for c in conns:
            c.send("exit")
        for w in workers:
            w.join(timeout=30)
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
    return {"nodes": args.nodes, "rendezvous_s": round(rendezvous_s, 4),
            "heartbeat_p50_ms": round(percentile(latencies, 50), 3),
            "heartbeat_p99_ms": round(percentile(latencies, 99), 3),
            "heartbeat_interval_s": args.heartbeat_interval, "orchestrator_cpu": cpu,
            "reform_after_kill_s": round(reform_s, 4), "detected_by": detected_by}


if __name__ == "__main__":
    sys.exit(main())
