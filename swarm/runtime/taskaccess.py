"""Which task a request names, and who may see and control it: the authoritative
record (here, at its home, or, its home not answering, at whichever node took its home
role over), and the caller's rights over it (runtime/localops.py's requests)."""

from __future__ import annotations

import functools
import os
import pwd
from collections.abc import Callable

import trio

from .. import codec, request_checks, wire
from .. import model as m
from .api import PeerCred, RequestError
from .net import TransportError
from .peers import ClusterNode, RemoteError
from .tasks import TaskTable, UnknownTask


class TaskAccess:
    """Finds the task a request names (here, or at its home) and says whether the
    caller may see and control it."""

    def __init__(
        self,
        *,
        node: m.NodeId,
        table: TaskTable,
        cluster: ClusterNode,
        copy_of: Callable[[m.TaskId], m.Task | None] = lambda tid: None,
    ) -> None:
        self.copy_of = copy_of  # a replica's copy of another home's task (issue 19)
        self.node = node
        self.table = table
        self.cluster = cluster
        # a task whose record came from our copy because its home did not answer:
        # what to tell the caller (read by op_status right after find)
        self.unanswered: dict[m.TaskId, str] = {}

    def operator(self, cred: PeerCred) -> bool:
        """Root and the agent's own user see and control every task here."""
        return cred.uid == 0 or cred.uid == os.getuid()

    def owns(self, task: m.Task, cred: PeerCred, name: str | None) -> bool:
        """Whether the caller submitted `task`: by uid at its home node, by user name
        elsewhere (uids may differ between hosts; names are what tasks run as)."""
        spec = task.spec
        if spec.uid is None:
            return True
        if spec.home in ("", self.node) or spec.user is None:
            return spec.uid == cred.uid
        return spec.user == name

    def authorize(self, task: m.Task, cred: PeerCred) -> None:
        if self.operator(cred) or self.owns(task, cred, user_name(cred.uid)):
            return
        raise RequestError("permission_denied", f"task {task.id} belongs to another user")

    async def find(self, tid: m.TaskId) -> m.Task:
        """The authoritative record: the home's. Ask the home (or everyone) if not here."""
        local: m.Task | None
        try:
            local = await self.table.get(tid)
        except UnknownTask:
            local = self.copy_of(tid)  # a copy we keep for its home, if any
        if local is not None and (local.spec.home in ("", self.node) or local.spec.is_global):
            return local
        homes = [local.spec.home] if local is not None else []
        if not homes and self.cluster.membership is not None:
            homes = [
                mb.node for mb in self.cluster.membership.alive_members() if mb.node != self.node
            ]
        found = await self._ask_records(homes, tid)
        if found is not None:
            return found
        if local is not None and self.cluster.membership is not None:
            # its home does not answer: another node may have taken it over (failover)
            others = [
                mb.node
                for mb in self.cluster.membership.alive_members()
                if mb.node not in (self.node, local.spec.home)
            ]
            found = await self._ask_records(others, tid)
            if found is not None and (
                found.spec.home not in ("", local.spec.home)
                or (found.state.terminal and not local.state.terminal)
            ):
                # taken over, or finished where it ran while our copy says otherwise
                # (chaos home-loss: a replica that missed the release answered `queued`)
                return found
        if local is not None:
            self._note(
                tid,
                f"its home {local.spec.home} did not answer: this is {self.node}'s copy of"
                " the record, which may be out of date",
            )
            return local
        raise RequestError("not_found", f"no task {tid}")

    async def _ask_records(self, nodes: list[m.NodeId], tid: m.TaskId) -> m.Task | None:
        """The record from the node that is its home, else a finished one from a node
        that held it, else any copy (with a note)."""
        results: list[tuple[bool, bool, m.Task]] = []  # (its home's, finished, record)

        async def ask(node: m.NodeId) -> None:
            try:
                r = await self.cluster.request(node, {"op": "task", "id": tid}, timeout=2.0)
            except (TransportError, RemoteError):
                return
            if r.get("task") is not None:
                try:
                    t = codec.task_from_wire(r["task"])
                except wire.WireError:
                    return
                results.append((t.spec.home == node, t.state.terminal, t))

        async with trio.open_nursery() as n:
            for node in nodes[:256]:
                n.start_soon(ask, node)
        if not results:
            return None
        authoritative, _, best = max(results, key=lambda r: (r[0], r[1]))
        if authoritative:
            return best
        # only a copy answered (a replica's, or a former holder's): say whose is silent
        self._note(tid, f"its home {best.spec.home} did not answer: this is a copy kept elsewhere")
        return best

    def _note(self, tid: m.TaskId, text: str) -> None:
        self.unanswered[tid] = text
        if len(self.unanswered) > 1024:
            self.unanswered.pop(next(iter(self.unanswered)))

    async def task(self, f: wire.Fields, cred: PeerCred | None = None) -> m.Task:
        tid = request_checks.check_task_id(f.str("id", required=True, max_len=m.MAX_TASK_ID_LEN))
        if cred is not None and "~" not in tid and m.valid_client_task_id(tid):
            # the caller's own chosen id, named without its owner part ("job1"), at the
            # node it was submitted to; the journal is read only for an id that does not
            # look generated (`swarm wait tXXXX` must not pay a disk read for this)
            own = m.owned_task_id(tid, cred.uid, user_name(cred.uid))
            cached = self.table.get_cached(own)
            if cached is not None:
                return cached
            if not m.GENERATED_TASK_ID.fullmatch(tid):
                try:
                    return await self.table.get(own)
                except UnknownTask:
                    pass
        return await self.find(tid)


@functools.lru_cache(maxsize=4096)
def user_name(uid: int) -> str | None:
    """Cached: a passwd lookup can cost a millisecond (NSS), once per submit adds up."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def unreachable(t: m.Task, what: str, e: Exception) -> RequestError:
    return RequestError(
        "unavailable",
        f"cannot reach {t.spec.home}, the home of {t.id} (it holds the record), to {what}: {e}",
    )
