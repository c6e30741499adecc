"""The workload side of a run: submissions at random nodes and drains/undrains, driven
through each agent's Unix socket exactly as `swarm submit` / `swarm drain` do.

The one piece of harness bookkeeping the checks take from here is `acked`: the tasks
whose submit returned an id (at which node, with which constraints). Everything else
is read back from the agents afterwards.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from swarm.client import ClientError, RequestFailed

from .cluster import ChaosAgent, ChaosCluster
from .invariants import Acked, Execution, Span
from .schedule import DrainPlan, SubmitPlan

SUBMIT_TIMEOUT = 4.0


def task_argv(marks: Path, seconds: float) -> list[str]:
    """The task: leave a mark (node and attempt) in a shared dir, then sleep a little."""
    mark = shlex.quote(str(marks)) + '/"$SWARM_TASK_ID"'
    return ["sh", "-c", f'echo "$SWARM_NODE $SWARM_ATTEMPT" >> {mark}; sleep {seconds}']


SLOW_NODE = "n1"  # kind `idempotent`: a quarter of its runs there take 6x as long


def idempotent_task_argv(marks: Path, seconds: float) -> list[str]:
    """An --idempotent task: a mark, then a sleep, 6x as long in a quarter of its runs
    on SLOW_NODE (by the shell's pid): about 5 % of all runs straggle, as in LATE's and
    Dolly's clusters; were every run there slow, a fifth of the class's runtimes would
    be slow and its 90th percentile a straggler's."""
    mark = shlex.quote(str(marks)) + '/"$SWARM_TASK_ID"'
    slow = f'if [ "$SWARM_NODE" = {SLOW_NODE} ] && [ $(($$ % 4)) -eq 0 ]; '
    slow += f"then sleep {6 * seconds:g}; else sleep {seconds}; fi"
    return ["sh", "-c", f'echo "$SWARM_NODE $SWARM_ATTEMPT" >> {mark}; {slow}']


def timed_task_argv(marks: Path, seconds: float) -> list[str]:
    """The task of the priority scenario: a mark with the wall time and the shell's pid
    when it starts, when it ends, and when it is stopped (SIGTERM/SIGINT: a preemption,
    a shutdown), so that executions can be laid out in time. A SIGKILL (an orphan killed
    by its restarted agent) leaves no end."""
    mark = shlex.quote(str(marks)) + '/"$SWARM_TASK_ID"'
    say = f'm() {{ echo "$SWARM_NODE $SWARM_ATTEMPT $1 $(date +%s.%N) $$" >> {mark}; }}'
    return ["sh", "-c", f"{say}; m start; trap 'm stop; exit 143' TERM INT; sleep {seconds}; m end"]


BEAT = 0.2  # seconds between the marks of an --at-most-once task


def beat_task_argv(marks: Path, seconds: float) -> list[str]:
    """The --at-most-once task: a timed start mark, then a mark every BEAT seconds while
    it runs (a SIGKILL, its fence, leaves no end: its last beat bounds it), then an end."""
    mark = shlex.quote(str(marks)) + '/"$SWARM_TASK_ID"'
    say = f'm() {{ echo "$SWARM_NODE $SWARM_ATTEMPT $1 $(date +%s.%N) $$" >> {mark}; }}'
    beats = max(1, round(seconds / BEAT))
    loop = f"n=0; while [ $n -lt {beats} ]; do sleep {BEAT}; m beat; n=$((n+1)); done"
    return ["sh", "-c", f"{say}; m start; {loop}; m end"]


def read_spans(marks: Path) -> dict[str, list[Span]]:
    """Task id -> each process's span from its timed marks, by start."""
    out: dict[str, list[Span]] = {}
    for tid, lines in _mark_files(marks):
        seen: dict[str, Span] = {}
        for ln in lines:
            f = ln.split()
            if len(f) < 5:
                continue
            try:
                at = float(f[3])
            except ValueError:
                continue
            node, pid = f[0], f[4]
            s = seen.get(pid)
            seen[pid] = Span(node, pid, at, at) if s is None else attrs.evolve(s, last=at)
        out[tid] = sorted(seen.values(), key=lambda s: s.first)
    return out


def _mark_files(marks: Path) -> list[tuple[str, list[str]]]:
    out = []
    for p in marks.iterdir() if marks.is_dir() else []:
        try:
            out.append((p.name, p.read_text(errors="replace").splitlines()))
        except OSError:
            continue
    return out


def read_marks(marks: Path) -> dict[str, list[str]]:
    """Task id -> the node of each execution that started its shell (the start line of
    a timed mark; its end/stop lines are not executions)."""
    out: dict[str, list[str]] = {}
    for tid, lines in _mark_files(marks):
        fields = [ln.split() for ln in lines if ln.strip()]
        out[tid] = [f[0] for f in fields if len(f) < 3 or f[2] == "start"]
    return out


def read_executions(marks: Path) -> dict[str, list[Execution]]:
    """Task id -> its executions from timed marks (`timed_task_argv`), by start time:
    a start line paired with the end or stop line of the same shell (pid)."""
    out: dict[str, list[Execution]] = {}
    for tid, lines in _mark_files(marks):
        open_: dict[str, int] = {}  # pid -> index of its execution without an end yet
        runs: list[Execution] = []
        for ln in lines:
            f = ln.split()
            if len(f) < 5:
                continue
            try:
                node, attempt, what, at, pid = f[0], int(f[1]), f[2], float(f[3]), f[4]
            except ValueError:
                continue
            if what == "start":
                open_[pid] = len(runs)
                runs.append(Execution(node, attempt, at))
            elif what in ("end", "stop") and pid in open_:
                k = open_.pop(pid)
                runs[k] = attrs.evolve(runs[k], end=at, stopped=what == "stop")
        out[tid] = sorted(runs, key=lambda r: r.start)
    return out


class Workload:
    def __init__(
        self,
        cl: ChaosCluster,
        marks: Path,
        t0: float,
        log: Callable[[str], None] = lambda s: None,
        timed: bool = True,
    ) -> None:
        self.cl = cl
        self.argv = timed_task_argv if timed else task_argv
        self.marks = marks
        marks.mkdir(parents=True, exist_ok=True)
        self.t0 = t0
        self.log = log
        self.acked: list[Acked] = []
        self.cancels: dict[str, str] = {}  # `cancel` tasks: the state the cancel answered
        self.kinds: Counter[str] = Counter()  # acknowledged, by workload kind
        self.attempted = 0
        self.refused: Counter[str] = Counter()  # why submissions were not acknowledged
        self.drains_done = 0
        self.drains_skipped = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def _sleep_until(self, offset: float) -> bool:
        delay = self.t0 + offset - time.time()
        if delay > 0:
            return not self._stop.wait(delay)
        return not self._stop.is_set()

    # ----------------------------------------------------------- submissions

    def submit_all(self, plans: list[SubmitPlan], workers: int = 4) -> None:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="submit") as pool:
            for sp in plans:
                if not self._sleep_until(sp.at):
                    break
                pool.submit(self._submit, sp)

    def _submit(self, sp: SubmitPlan) -> None:
        a = self.cl.agents[sp.node - 1]
        extra: dict[str, Any] = {}
        if sp.weight is not None:
            extra["weight"] = sp.weight
        if sp.reserve:
            extra["reserve_shares"] = sp.reserve
        if sp.kind == "global":
            extra["is_global"] = True
        if sp.priority is not None:
            extra["priority"] = sp.priority
        if sp.constraints:
            extra["constraints"] = list(sp.constraints)
        if sp.migrate is not None:
            extra["migrate"] = sp.migrate
        argv = self.argv(self.marks, sp.seconds)
        if sp.kind == "at-most-once":
            extra["at_most_once"] = True
            argv = beat_task_argv(self.marks, sp.seconds)
        if sp.kind == "idempotent":  # issue 24: may get a backup
            extra["idempotent"] = True
            argv = idempotent_task_argv(self.marks, sp.seconds)
        if sp.array:  # issue 23: {index} in argv, its elements leave marks as tasks do
            extra["array"] = sp.array
        if sp.kind == "after":
            with self._lock:
                earlier = [x.id for x in self.acked if not x.is_global]
            if not earlier:
                return
            parent = earlier[-min(sp.pick, len(earlier))]
            extra["after"] = [f"{sp.cond}:{parent}"]
        if sp.gang:  # issue 22: its members beat as --at-most-once tasks do
            extra.update(gang=sp.gang, gang_mode="strict" if sp.strict else "nonstrict")
            if not sp.strict:
                extra["min_available"] = sp.gang - 1
            argv = beat_task_argv(self.marks, sp.seconds)
        with self._lock:
            self.attempted += 1
        try:
            with a.client(timeout=SUBMIT_TIMEOUT) as c:
                answer = c.submit_answer(
                    argv,
                    cwd="/",
                    no_retry=sp.kind == "no-retry",
                    name=sp.kind,
                    **extra,
                )
            tid = str(answer["id"])
            copies = answer.get("replicas")
        except RequestFailed as e:
            self._refuse(e.code)
            return
        except TimeoutError:
            self._refuse("timeout")
            return
        except (ClientError, OSError) as e:
            self._refuse("unreachable")
            if self.refused["unreachable"] <= 3:
                self.log(f"submit to {a.name}: {type(e).__name__}: {e}")
            return
        with self._lock:
            amo = sp.kind == "at-most-once"
            self.acked.append(
                Acked(
                    tid,
                    a.name,
                    sp.kind == "global",
                    sp.constraints,
                    amo,
                    sp.gang,
                    sp.strict,
                    array=_canonical(sp.array),
                    after=tuple(extra.get("after", ())),
                    at=time.time(),
                    copies=copies if isinstance(copies, int) else None,
                )
            )
            self.kinds[sp.kind] += 1
        if sp.kind == "cancel":
            threading.Thread(target=self._cancel, args=(tid, sp), daemon=True).start()

    def _cancel(self, tid: str, sp: SubmitPlan) -> None:
        """Cancel `tid` at node `sp.cancel_node`, `sp.cancel_after` seconds from now;
        remember what the cancel answered (the task's state, or why it failed)."""
        if self._stop.wait(sp.cancel_after):
            return
        a = self.cl.agents[sp.cancel_node - 1]
        try:
            with a.client(timeout=SUBMIT_TIMEOUT * 3) as c:
                state = str(c.cancel(tid).get("task", {}).get("state", "?"))
        except RequestFailed as e:
            state = f"refused: {e.code}"
        except (TimeoutError, ClientError, OSError) as e:
            state = f"unanswered: {type(e).__name__}"
        with self._lock:
            self.cancels[tid] = state

    def _refuse(self, why: str) -> None:
        with self._lock:
            self.refused[why] += 1

    # ---------------------------------------------------------------- drains

    def drain_all(self, plans: list[DrainPlan]) -> None:
        """Each drain in its own thread (they may overlap); returns when all are undone."""
        threads = [threading.Thread(target=self._drain, args=(dp,), daemon=True) for dp in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _drain(self, dp: DrainPlan) -> None:
        if not self._sleep_until(dp.start):
            return
        a = self.cl.agents[dp.node - 1]
        if not a.alive() or a.paused or not self._shares(a, drain=True):
            with self._lock:
                self.drains_skipped += 1
            return
        with self._lock:
            self.drains_done += 1
        self._sleep_until(dp.end)
        self.undrain(a, deadline=60.0)

    def _shares(self, a: ChaosAgent, **fields: Any) -> bool:
        try:
            with a.client(timeout=SUBMIT_TIMEOUT) as c:
                c.call("shares", **fields)
            return True
        except (ClientError, OSError):
            return False

    def undrain(self, a: ChaosAgent, deadline: float) -> bool:
        """Undrain, retrying while the agent is down or frozen."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if a.alive() and not a.paused and self._shares(a, undrain=True):
                return True
            time.sleep(0.5)
        self.log(f"could not undrain {a.name}")
        return False

    def ensure_undrained(self) -> None:
        """After the last heal: no node is left drained (a drain that timed out on a
        frozen agent may have landed after its undrain)."""
        for a in self.cl.agents:
            info = self.cl.info(a)
            if info is not None and info.get("shares") == 0:
                self.undrain(a, deadline=30.0)


def _canonical(text: str) -> str:
    from swarm.policy.arrays import parse_array

    return parse_array(text).text() if text else ""
