"""Python's cyclic garbage collector paused for the length of a volume tick (:func:`collector_paused`).

Reference counting frees almost everything a tick drops; what the cyclic collector adds during a large
tick is full collections that walk every object of the code server, started by the objects the tick
keeps until it ends (``volume_tick_50000`` in ``bench_results.json``, and the deploy-and-scale guide).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time

#: seconds the collector stays paused at most while ticks overlap one another: past it, the tick that ends
#: collects the young generations (the cyclic garbage of the pause) before the next one carries the pause on
MAX_PAUSE_S = 30.0

_gc_lock = threading.Lock()
_gc_pausers = 0  # ticks running in this process with the collector paused
_gc_resume = False  # whether the first of them found it enabled
_gc_since = 0.0  # when the collector was last paused or collected


def _after_fork_in_child() -> None:
    """A process forked during a tick runs no tick: its collector is as the parent found it, its lock new."""
    global _gc_lock, _gc_pausers
    _gc_lock = threading.Lock()
    if _gc_pausers and _gc_resume:
        gc.enable()
    _gc_pausers = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector paused while open (reference counting still frees what a tick drops).

    A tick keeps three objects per table until it ends (its count, its outcome, the new history). At 50,000
    tables that starts a full collection on almost every tick, which walks every object of the code server:
    0.3-0.6 s a tick on the 2-core machine (at 5,000 tables, 0.2 s one tick in five). Paused, the collector
    starts again when the last tick of this process ends and finds the tick's objects already freed; what it
    still collects then is the cyclic garbage anything in the process made meanwhile (a tick lasts seconds).
    Ticks of two sensors at once share the pause; a collector the process had disabled stays disabled. Ticks
    that keep overlapping one another (many sensors in one code server) would never resume it: a tick that
    ends while others run and the pause has lasted over :data:`MAX_PAUSE_S` collects the young generations,
    where everything made during the pause is. A process forked during a tick starts with the collector as
    the parent found it. Code that disables the collector while a tick runs has it enabled again when the
    last tick ends (the pause cannot tell its own disabling from another's)."""
    global _gc_pausers, _gc_resume, _gc_since
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_resume, _gc_since = gc.isenabled(), time.monotonic()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        collect = False
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_resume:
                gc.enable()
            elif _gc_pausers and _gc_resume and time.monotonic() - _gc_since > MAX_PAUSE_S:
                collect, _gc_since = True, time.monotonic()
        if collect:  # ticks that keep overlapping never resume it: collect what the pause left (outside the
            gc.collect(1)  # lock: a finalizer the collection runs may start a tick)
