"""Where tasks run: a Ray cluster, or this process.

`make_executor(address)` returns a `RayExecutor` when Ray is installed (with no
`address` and no cluster, `ray.init()` starts a local one, so one machine works
out of the box; `address` joins an existing cluster, e.g. "auto" or
"10.0.0.5:6379"), else an `InProcessExecutor`. Both run a module-level function
over a list of argument tuples and give back, per task, its value or the error
it raised, in order: one task's failure never stops the others. kiln adds no
scheduler, RPC or tracker of its own; Ray places the tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kiln.errors import UsageError


@dataclass(frozen=True)
class TaskOutcome:
    """One task's value, or the one-line error it ended with."""

    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the task returned a value."""
        return self.error is None


#: What `Executor.submit` returns: call it to wait for the tasks' outcomes, in order.
Pending = Callable[[], list[TaskOutcome]]


class Executor(Protocol):
    """Runs tasks; `describe()` says where (engine, cluster address, nodes)."""

    def put(self, value: Any) -> Any:
        """A handle for `value` that tasks take as an argument (shipped once)."""

    def run(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *,
            num_cpus: float = 1, resources: dict[str, float] | None = None
            ) -> list[TaskOutcome]:
        """`fn(*a)` for every `a` in `args`, each as one task."""

    def submit(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *,
               num_cpus: float = 1, resources: dict[str, float] | None = None) -> Pending:
        """Start the tasks of `run` and return at once (this process: run them now);
        calling the result waits for their outcomes. Work submitted later may run
        while these do (how `kiln tune` overlaps builds with measurements)."""

    def first_done(self, pending: Sequence[Pending]) -> int:
        """The index of one of `pending` (from `submit`, not empty) whose tasks have all ended,
        waiting until one has: the first such, so an executor whose tasks end in
        submission order gives the same answers every run."""

    def describe(self) -> dict[str, Any]:
        """Where the work runs, for logs and summaries."""

    def close(self) -> None:
        """Release what the executor started (a local Ray instance)."""


def error_line(exc: BaseException) -> str:
    """`Type: first line of the message` (the type alone for an empty message)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class InProcessExecutor:
    """Every task in this process, one after another (no Ray needed)."""

    def put(self, value: Any) -> Any:
        return value

    def run(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *,
            num_cpus: float = 1, resources: dict[str, float] | None = None
            ) -> list[TaskOutcome]:
        out = []
        for a in args:
            try:
                out.append(TaskOutcome(fn(*a)))
            except Exception as exc:  # a task's failure is its outcome
                out.append(TaskOutcome(error=error_line(exc)))
        return out

    def submit(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *,
               num_cpus: float = 1, resources: dict[str, float] | None = None) -> Pending:
        out = self.run(fn, args)
        return lambda: out

    def first_done(self, pending: Sequence[Pending]) -> int:
        return 0  # they ran when submitted

    def describe(self) -> dict[str, Any]:
        return {"engine": "in-process", "address": None, "nodes": []}

    def close(self) -> None:
        pass


@dataclass
class RayExecutor:
    """Tasks on a Ray cluster: `address` joins one, None starts a local instance (with
    the custom `resources`, e.g. kiln tune's measurement resource; a joined cluster's
    nodes declare theirs in `ray start --resources`)."""

    address: str | None = None
    resources: dict[str, float] | None = None
    num_cpus: int | None = None
    _started: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        import ray  # optional: ray (the distributed extra)

        if not ray.is_initialized():
            local = self.address is None  # a joined cluster's nodes have their own
            try:
                # Ray starts its workers at niceness 15: on a machine with other work
                # they then get a sliver of a CPU (builds crawl, timings measure the
                # other work); a local instance's run at the driver's priority
                ray.init(address=self.address, include_dashboard=False,
                         log_to_driver=False, configure_logging=False,
                         resources=self.resources if local else None,
                         num_cpus=self.num_cpus if local else None,
                         _system_config={"worker_niceness": 0} if local else None)
            except ConnectionError as exc:
                raise UsageError(f"cannot join the Ray cluster at {self.address!r}: {exc}"
                                 ) from None
            self._started = True

    def put(self, value: Any) -> Any:
        import ray  # optional: ray (the distributed extra)

        return ray.put(value)

    def run(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *,
            num_cpus: float = 1, resources: dict[str, float] | None = None
            ) -> list[TaskOutcome]:
        return self.submit(fn, args, num_cpus=num_cpus, resources=resources)()

    def submit(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *,
               num_cpus: float = 1, resources: dict[str, float] | None = None) -> Pending:
        import ray  # optional: ray (the distributed extra)

        remote = ray.remote(fn).options(num_cpus=num_cpus, resources=resources or {},
                                        max_retries=0)
        return _RayPending([remote.remote(*a) for a in args])

    def first_done(self, pending: Sequence[Pending]) -> int:
        import ray  # optional: ray (the distributed extra)

        assert pending, "first_done of no pending tasks"
        while True:
            running = []
            for i, p in enumerate(pending):
                refs = p.refs if isinstance(p, _RayPending) else []
                _, left = ray.wait(refs, num_returns=len(refs), timeout=0,
                                   fetch_local=False) if refs else ([], [])
                if not left:
                    return i
                running += left
            ray.wait(running, num_returns=1, fetch_local=False)  # until one more ends

    def describe(self) -> dict[str, Any]:
        import ray  # optional: ray (the distributed extra)

        nodes = [{"id": n["NodeID"], "address": n["NodeManagerAddress"],
                  "cpus": n.get("Resources", {}).get("CPU", 0),
                  "resources": sorted(k for k in n.get("Resources", {})
                                      if not k.startswith(("node:", "memory",
                                                           "object_store_memory")))}
                 for n in ray.nodes() if n.get("Alive")]
        context = ray.get_runtime_context()
        return {"engine": "ray", "address": self.address or "local",
                "gcs_address": getattr(context, "gcs_address", None), "nodes": nodes}

    def close(self) -> None:
        import ray  # optional: ray (the distributed extra)

        if self._started and ray.is_initialized():
            ray.shutdown()


@dataclass
class _RayPending:
    """Ray tasks started by `RayExecutor.submit`: calling waits for their outcomes."""

    refs: list[Any]

    def __call__(self) -> list[TaskOutcome]:
        import ray  # optional: ray (the distributed extra)

        out = []
        for ref in self.refs:
            try:
                out.append(TaskOutcome(ray.get(ref)))
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                out.append(TaskOutcome(error=error_line(cause)))
            except ray.exceptions.RayError as exc:  # a worker or node died
                out.append(TaskOutcome(error=error_line(exc)))
        return out


def make_executor(address: str | None = None, *, in_process: bool = False,
                  resources: dict[str, float] | None = None, num_cpus: int | None = None
                  ) -> Executor:
    """Ray when installed and not `in_process`, else this process. An `address`
    without Ray installed is a UsageError (the user asked for a cluster). `resources`
    and `num_cpus` shape a local Ray instance (no `address`)."""
    if in_process:
        return InProcessExecutor()
    try:
        import ray  # optional: ray (the distributed extra)  # noqa: F401
    except ImportError:
        if address is not None:
            raise UsageError("--address needs Ray: pip install 'kiln-tensor[distributed]'"
                             ) from None
        return InProcessExecutor()
    return RayExecutor(address, resources, num_cpus)


def task_node() -> str:
    """The Ray node id of the task running this (\"local\" outside Ray)."""
    try:
        import ray  # optional: ray (the distributed extra)
    except ImportError:
        return "local"
    if not ray.is_initialized():
        return "local"
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # outside a task there is no node to name
        return "local"
