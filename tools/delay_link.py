"""A slow link in userspace, for kernels without tc's netem (standard library only).

Run in the bridge's network namespace by ``tools/netns.Hosts.delay``: it reads the frames a host
sends on its switch port (a packet socket on the veth end, taken off the bridge) and hands them
to the bridge through a TAP device after ``--delay_ms``; the bridge's frames for the host, read
from the TAP device, go back out of the port at once. The virtio header travels with each frame
(``PACKET_VNET_HDR`` on the socket, ``IFF_VNET_HDR`` on the TAP device), so the veth's offloads
(checksums left to the hardware, TCP segments of up to 64 KiB) cross the forwarder unchanged.

Prints ``ready`` once both ends are open. The queue is bounded (``--queue_bytes``; a frame that
does not fit is dropped, as a full router queue drops it). When its stdin closes (the caller
heals the link, or died) it sends what it still holds at once, passes on the bridge's frames for
the host a moment longer and exits; the TAP device goes with it.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import functools
import os
import selectors
import socket
import struct
import sys
import time

TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN = 0x01, 0x02, 0x04, 0x08
ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
FRAME_MAX = 1 << 18  # a 64 KiB segment with its headers, with room to spare
QUEUE_BYTES = 32 << 20
LINGER_S = 0.25


class DelayLine:
    """Frames in arrival order, each released `delay_s` after it came; at most `capacity` bytes
    held (a frame that does not fit is dropped)."""

    def __init__(self, delay_s: float, capacity: int = QUEUE_BYTES):
        self.delay_s = delay_s
        self.capacity = capacity
        self.held = 0
        self.dropped = 0
        self._frames: collections.deque[tuple[float, bytes]] = collections.deque()

    def push(self, now: float, frame: bytes) -> bool:
        """Queues `frame`; False (and counted) when the queue is full."""
        if self.held + len(frame) > self.capacity:
            self.dropped += 1
            return False
        self._frames.append((now + self.delay_s, frame))
        self.held += len(frame)
        return True

    def due(self, now: float) -> list[bytes]:
        """The frames whose time has come, oldest first (all of them when `now` is inf)."""
        out = []
        while self._frames and self._frames[0][0] <= now:
            out.append(self._frames.popleft()[1])
            self.held -= len(out[-1])
        return out

    def wait_s(self, now: float) -> float | None:
        """Seconds until the next frame is due; None when nothing is held."""
        return max(0.0, self._frames[0][0] - now) if self._frames else None


def open_tap(name: str) -> int:
    """A TAP device `name` (non-blocking; it lives as long as the descriptor)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), flags))
    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN)
    return fd


def open_port(name: str) -> socket.socket:
    """A packet socket on interface `name` that reads only the frames arriving on it."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)  # only what the host sends
    sock.bind((name, ETH_P_ALL))
    sock.setblocking(False)
    return sock


def _drain(read) -> list[bytes]:
    frames = []
    while True:
        try:
            frames.append(read())
        except BlockingIOError:
            return frames


def _send(write, frame: bytes) -> None:
    try:
        write(frame)
    except OSError:  # the other end is down or its queue full: the frame is lost, as on a wire
        pass


def forward(tap: int, port: socket.socket, line: DelayLine) -> None:
    """Until stdin closes: the host's frames to the bridge after the delay, the bridge's to the
    host at once. Then what is held, at once, and for LINGER_S more the bridge's frames to the
    host (frames the bridge still sends here until the host's own frames, on its port back on the
    bridge, teach it where the host is), while the host's frames go the direct way only."""
    selector = selectors.DefaultSelector()
    selector.register(tap, selectors.EVENT_READ, "tap")
    selector.register(port, selectors.EVENT_READ, "port")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    to_bridge = functools.partial(os.write, tap)
    healed_at = None
    while healed_at is None or time.monotonic() < healed_at + LINGER_S:
        timeout = (line.wait_s(time.monotonic()) if healed_at is None
                   else healed_at + LINGER_S - time.monotonic())
        ready = selector.select(timeout)
        now = time.monotonic()
        for key, _ in ready:
            if key.data == "port":
                frames = _drain(lambda: port.recv(FRAME_MAX))
                for frame in frames if healed_at is None else ():
                    line.push(now, frame)
            elif key.data == "tap":
                for frame in _drain(lambda: os.read(tap, FRAME_MAX)):
                    _send(port.send, frame)
            elif not sys.stdin.buffer.read1(4096):
                selector.unregister(sys.stdin)
                healed_at = now
                for frame in line.due(float("inf")):
                    _send(to_bridge, frame)
        for frame in line.due(now):
            _send(to_bridge, frame)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", required=True, help="the host's switch port (a veth end)")
    parser.add_argument("--tap", required=True, help="the TAP device to make, for the bridge")
    parser.add_argument("--delay_ms", type=float, required=True,
                        help="how long each frame from the host waits")
    parser.add_argument("--queue_bytes", type=int, default=QUEUE_BYTES)
    args = parser.parse_args(argv)
    tap = open_tap(args.tap)
    port = open_port(args.port)
    print("ready", flush=True)
    forward(tap, port, DelayLine(args.delay_ms / 1e3, args.queue_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
