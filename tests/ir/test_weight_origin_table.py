"""The table of recorded weight origins (kiln.ir.weight_origin): an array that dies
while the table's lock is held (the collector runs inside `record`) leaves no deadlock
and no stale entry.

The check runs in a subprocess: a regression would hang, and the subprocess's timeout
turns that into a failure instead of a stuck suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc
    import numpy as np
    from kiln.ir import weight_origin as wo

    class Cycle:  # freed only by the cyclic collector
        pass

    def doomed():
        a = np.arange(8.0)
        wo.record(a, wo.weight("w", a))
        c = Cycle()
        c.self, c.array = c, a  # the array dies when the collector frees the cycle
        return id(a)

    gc.disable()
    keys = [doomed() for _ in range(200)]
    # the collector frees every cycle while `record` holds the table's lock
    real = wo.weakref.ref

    def collecting_ref(obj, callback=None):
        gc.collect()
        return real(obj, callback)

    wo.weakref.ref = collecting_ref
    b = np.ones(4)
    wo.record(b, wo.weight("b", b))
    wo.weakref.ref = real
    c = np.zeros(3)
    wo.record(c, wo.weight("c", c))  # drops the dead arrays' entries
    assert wo.origin_of(b) == wo.weight("b", b) and wo.origin_of(c) == wo.weight("c", c)
    stale = [k for k in keys if k in wo._TABLE and wo._TABLE[k][0]() is None]
    assert not stale, stale
    print("ok")
""")


def test_an_array_dying_inside_record_neither_deadlocks_nor_stays() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
