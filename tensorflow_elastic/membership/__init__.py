"""A worker's side of membership, TensorFlow-free: its session with the orchestrator (join,
heartbeats, watch, barriers, exchanges), its phase (phase.py: one enum, one transition method)
and the progress watchdog. The orchestrator and its client live in rendezvous/; the order of
every membership change is the runtime's (strategy/runtime.py).
"""
