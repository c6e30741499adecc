"""Discrete-event simulator of a swarm cluster, its workloads and experiments.

The engine (`swarm.sim.engine`) drives swarm's own policy code; `swarm.sim.workloads`
generates or replays work; `swarm.sim.experiments` holds the six experiments behind
`swarm sim NAME`. Import the submodules directly: nothing here imports matplotlib.
"""
