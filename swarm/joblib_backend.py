"""A joblib backend that runs batches on the fleet (issue 23): `import swarm.joblib_backend`
registers it as "swarm".

    import joblib, swarm.joblib_backend
    with joblib.parallel_config(backend="swarm"):
        out = joblib.Parallel(n_jobs=8)(joblib.delayed(f)(x) for x in data)

Each batch joblib forms is one `swarm.Executor` call (a task); joblib's auto-batching
sizes the batches to the tasks' measured duration, as with its process backends, so
that a task's overhead (tens of milliseconds) stays small next to its work.
`n_jobs=-1` means the cluster's slots (every live node's, from `swarm nodes`). The
remote side needs joblib and the modules of the called functions (see swarm/futures.py).
"""

from __future__ import annotations

from typing import Any

from joblib import register_parallel_backend
from joblib._parallel_backends import AutoBatchingMixin, ParallelBackendBase

from .client import Client
from .futures import Executor


class SwarmBackend(AutoBatchingMixin, ParallelBackendBase):  # type: ignore[misc]
    supports_retrieve_callback = True
    supports_timeout = True
    uses_threads = False
    supports_sharedmem = False

    def __init__(
        self,
        socket: str | None = None,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        self._socket = socket
        self._options = options
        self._executor: Executor | None = None

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None or n_jobs < 0:
            with Client(self._socket) if self._socket else Client() as c:
                nodes = c.call("nodes")["nodes"]
            slots = sum(
                int(n.get("load", {}).get("slots", 1)) for n in nodes if n.get("state") == "alive"
            )
            return (
                max(1, slots + 1 + n_jobs) if n_jobs is not None and n_jobs < -1 else max(1, slots)
            )
        return int(n_jobs)

    def configure(self, n_jobs: int = 1, parallel: Any = None, **backend_kwargs: Any) -> int:
        self.parallel = parallel
        if self._executor is None:
            self._executor = Executor(self._socket, **self._options)
        return self.effective_n_jobs(n_jobs)

    def submit(self, func: Any, callback: Any = None) -> Any:
        assert self._executor is not None, "configure() first"
        future = self._executor.submit(func)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def retrieve_result_callback(self, future: Any) -> Any:
        return future.result()

    def terminate(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def abort_everything(self, ensure_ready: bool = True) -> None:
        self.terminate()
        if ensure_ready and self.parallel is not None:
            self.configure(
                n_jobs=self.parallel.n_jobs, parallel=self.parallel, **self.parallel._backend_kwargs
            )


register_parallel_backend("swarm", SwarmBackend)
