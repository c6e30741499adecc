"""Bounds of a submit request's numeric and size fields (shared by agent and client).

The agent checks them in swarm.request_checks; the client checks the same ones before it
sends (swarm.client), so a value that cannot even be encoded (an integer past 64 bits,
a request over the frame limit) is named as a field, never a traceback. Light to
import: constants only.
"""

from __future__ import annotations

MAX_FRAME = 4 * 1024 * 1024  # = wire.MAX_FRAME: the agent refuses a longer frame
MAX_ARGV_BYTES = 1 << 20  # total characters of argv
MAX_WEIGHT = 1e6
MAX_RESERVE_SHARES = 1 << 31
MAX_CPU = 1e5  # cores
MAX_MEM = 1 << 60  # bytes (1 EiB): larger is a typo, not a machine
MAX_EXPECTED_RUNTIME = 1e9  # seconds (~31 years)
MAX_REPORT_BANDS = 8  # priority values in one load report (it must fit a datagram)
MAX_REPORT_GROUPS = 8  # accounting groups in one load report (the busiest)
MAX_REPORT_PRINCIPALS = 12  # usage entries in one load report (the rest summed)
# bytes the three fields above may take (a load report must fit its share of a
# 1,400-byte gossip datagram, about 660 bytes, next to up to 8 GPUs' summaries)
REPORT_SHARE_BYTES = 300
# a load report's task_seconds and unmovable_seconds (issue 25): the agent reports at
# most this (a record started at time 0 summed over many tasks must not make its
# report undecodable), peers refuse more
MAX_REPORT_SECONDS = 1e12
