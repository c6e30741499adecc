"""swarm: decentralized peer-to-peer load sharing."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`swarm.Executor` (issue 23), imported on first use: `import swarm` stays light."""
    if name == "Executor":
        import importlib  # (not `from .futures import`: the package stays below its modules)

        return importlib.import_module("swarm.futures").Executor
    raise AttributeError(f"module 'swarm' has no attribute {name!r}")
