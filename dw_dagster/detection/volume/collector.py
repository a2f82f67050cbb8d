"""Python's cyclic garbage collector paused for the length of a volume tick (:func:`collector_paused`).

Reference counting frees almost everything a tick drops; what the cyclic collector adds during a large
tick is full collections that walk every object of the code server, started by the objects the tick
keeps until it ends (``volume_tick_50000`` in ``bench_results.json``, and the deploy-and-scale guide).
"""

from __future__ import annotations

import contextlib
import gc
import threading

_gc_lock = threading.Lock()
_gc_pausers = 0  # ticks running in this process with the collector paused
_gc_resume = False  # whether the first of them found it enabled


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector paused while open (reference counting still frees what a tick drops).

    A tick keeps three objects per table until it ends (its count, its outcome, the new history). At 50,000
    tables that starts a full collection on almost every tick, which walks every object of the code server:
    0.3-0.6 s a tick on the 2-core machine (at 5,000 tables, 0.2 s one tick in five). Paused, the collector
    starts again when the last tick of this process ends and finds the tick's objects already freed; what it
    still collects then is the cyclic garbage anything in the process made meanwhile (a tick lasts seconds).
    Ticks of two sensors at once share the pause; a collector the process had disabled stays disabled."""
    global _gc_pausers, _gc_resume
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_resume:
                gc.enable()
