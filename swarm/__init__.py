"""swarm: decentralized peer-to-peer load sharing."""

__version__ = "0.1.0"
