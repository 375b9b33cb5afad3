"""`kiln tune MODEL -t TARGET --budget 10m -o model.tuning.json`: measure kernel variants
(kiln.distributed.tune) and merge the records into a tuning database."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kiln.cli.flags import MAX_WORKERS, max_threads
from kiln.errors import UsageError, shown

#: Seconds kept from the budget for closing a Ray executor (`ray.shutdown()`, about
#: 1.5 s on a 2-vCPU host), which runs after the tuning.
CLOSE_RAY_S = 3.0


def tuning_budget(seconds: float, began: float, now: float, engine: str, budget: str) -> float:
    """What is left of `--budget` (`seconds`, the command began at `began`) for the
    tuning once the executor is up at `now`: the budget is the command's, so starting
    Ray (ten seconds and more) and closing it count. UsageError when nothing is left."""
    spent = now - began
    left = seconds - spent - (CLOSE_RAY_S if engine == "ray" else 0.0)
    if left <= 0:
        kept = f" and {CLOSE_RAY_S:.0f} s are kept for closing it" if engine == "ray" else ""
        raise UsageError(f"--budget {budget}: starting {engine} took {spent:.0f} s of the "
                         f"{seconds:.0f} s{kept}; give a longer budget, or --in-process")
    return left


def cmd_tune(model: str, target: str | None, budget: str, output: str, address: str | None,
             in_process: bool, shapes: dict[str, Any], workers: int | None,
             threads: int | None = None, clock: Callable[[], float] = time.monotonic) -> str:
    """Tune and save; the closing summary (the log lines are printed as they come).
    UsageError, before anything is measured, for a thread or worker count out of
    range (the command line's flags are checked by kiln.cli.flags already). The
    budget counts from the call (`clock`), so the command ends within it."""
    began = clock()
    from kiln.distributed.executor import (
        make_executor,  # heavy: kept off the cli's startup (kiln --help)
    )
    from kiln.distributed.model_tuning import (
        tune_model,  # heavy: kept off the cli's startup (kiln --help)
    )
    from kiln.distributed.tune import (  # heavy: kept off the cli's startup (kiln --help)
        measure_resource,
        resolve,
    )
    from kiln.frontend.onnx.file_limits import (
        check_model_file,  # heavy: kept off the cli's startup (kiln --help)
    )
    from kiln.tuning import parse_budget  # heavy: kept off the cli's startup (kiln --help)

    seconds = parse_budget(budget)
    for flag, value, top in (("--threads", threads, max_threads()),
                             ("--workers", workers, MAX_WORKERS)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= top):
            raise UsageError(f"{flag} takes an integer from 1 to {top}, got {shown(value)}")
    check_model_file(model)  # before a worker starts (docs/security.md, "Limits")
    tgt = resolve(target or "host")
    # a local Ray instance is this machine: it measures for the target only when its
    # CPU is the target's
    here = measure_resource(resolve("host"))
    executor = make_executor(address, in_process=in_process, num_cpus=workers,
                             resources={here: 1.0})
    try:
        where = executor.describe()
        nodes = where.get("nodes") or []
        print(f"running on: {where['engine']}"
              + (f" at {where.get('address')}, {len(nodes)} node(s): "
                 + ", ".join(f"{n['id'][:12]} ({n['address']}, {n['cpus']:g} CPU)"
                             for n in nodes) if where["engine"] == "ray" else "")
              + (f"; measurements on nodes with resource {measure_resource(tgt)}"
                 if where["engine"] == "ray" else ""), flush=True)
        left = tuning_budget(seconds, began, clock(), where["engine"], budget)
        if where["engine"] == "ray":
            print(f"budget: {left:.0f} s of {seconds:.0f} s left for tuning (starting and "
                  f"closing {where['engine']} take the rest)", flush=True)
        report = tune_model(model, tgt, left, output, executor=executor, shapes=shapes,
                            log=lambda line: print(line, flush=True), threads=threads)
    finally:
        executor.close()
    chosen = sum(1 for r in report.database.records() if r.chosen is not None)
    lines = [f"measured {report.measured} candidate(s) of {report.kernels} kernel(s) in "
             f"{report.seconds:.0f} s; {chosen} record(s) choose a variant other than the rule's",
             f"builds ran on: {', '.join(sorted(n[:12] for n in report.builds_on)) or '-'}; "
             f"measurements on: {', '.join(sorted(n[:12] for n in report.measured_on)) or '-'}"]
    check = report.check
    if check is not None:
        lines.append(f"model check: {len(check.accepted)} of "
                     f"{len(check.accepted) + len(check.rejected)} choice(s) accepted in the "
                     "model (a compile of this model applies only those)")
    if report.discarded:
        lines.append(f"{len(report.discarded)} candidate(s) discarded (see above)")
    lines.append(f"wrote {output} (fingerprint {report.database.fingerprint()[:16]})")
    return "\n".join(lines)
