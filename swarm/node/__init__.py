"""The node's own decisions, pure (no I/O): task records, handoff reactions, the start
gate, journal key schema and recovery, profile presets.

`NodeState.handle(*stimuli)` returns instructions that the runtime's driver carries
out in list order (a durable journal write before the send that depends on it is an
order of the list, not a convention). No trio, os, time, sockets or files here:
time comes in with each stimulus (`now`: trio's clock, `wall`: the wall clock).
"""
