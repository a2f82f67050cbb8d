"""A sensor cursor over records ordered by ``(updated_ts, id)`` that never loses or repeats one.

Polling an API by "updated since" has two classic failure modes (``shared/cases/PUBLIC_CASES.md``):

- **C20, ties**: records sharing the last seen ``updated_ts`` that become visible after the poll
  are skipped by a strict ``>`` cursor, and re-emitted by a naive ``>=`` one.
- **C21, a failing record**: a cursor that moves to the newest record loses the one that failed;
  a cursor that stops at the failure repeats every record after it on the next tick.

:class:`UpdatedTsCursor` keeps a watermark ``(updated_ts, id)`` that never passes an unhandled
record, and the set of ``(id, updated_ts)`` already handled at or after it. The next poll re-reads
inclusively from the watermark (minus an optional overlap for late-visible records) and
:meth:`is_handled` filters what was done. A new ``updated_ts`` of the same id is a new version
and is handled again. Handled entries older than the watermark minus the overlap are pruned, so
the cursor stays small: its size depends on the records inside the overlap window, never on the
history.

A record that keeps failing would hold the watermark forever (and with it every later record in
the handled set). :meth:`record_failure` counts the tries of each failing version in the cursor
(``attempts``; only versions that failed on the last tick are kept), so the caller can give up on
one after N tries, quarantine it and mark it done.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field


def _ts_key(ts: float) -> str:
    return repr(float(ts))


def _finite(value: object) -> float:
    """A stored timestamp as a finite float (ValueError otherwise: the cursor is unreadable)."""
    ts = float(value)  # type: ignore[arg-type]
    if not math.isfinite(ts):
        raise ValueError(f"timestamp {value!r} is not finite")
    return ts


@dataclass
class UpdatedTsCursor:
    """Watermark plus handled set; JSON-serializable with :meth:`dumps`.

    Attributes:
        updated_ts: watermark, epoch seconds (None before the first record).
        last_id: id of the last record handled at the watermark (informational).
        handled: id → ``repr(updated_ts)`` of versions handled at or after ``updated_ts - overlap_s``.
        overlap_s: seconds re-read below the watermark on every poll.
        attempts: id → ``[repr(updated_ts), tries]`` of the versions that failed on the last tick
            (serialized only when not empty).
    """

    updated_ts: float | None = None
    last_id: str | None = None
    handled: dict[str, list[str]] = field(default_factory=dict)
    overlap_s: float = 0.0
    attempts: dict[str, list] = field(default_factory=dict)

    @classmethod
    def loads(cls, text: str | None, overlap_s: float = 0.0, warn: Callable[[str], None] | None = None) -> UpdatedTsCursor:
        """Parse a cursor; an empty one starts from scratch, an unreadable one too (``warn`` is told)."""
        if not text:
            return cls(overlap_s=overlap_s)
        try:
            data = json.loads(text)
            ts = data.get("updated_ts")
            handled = data.get("handled") or {}
            if ts is not None and (not isinstance(ts, (int, float)) or not math.isfinite(ts)):
                raise ValueError("bad watermark")
            if not isinstance(handled, dict):
                raise ValueError("bad handled set")
            clean = {str(k): [_ts_key(_finite(x)) for x in (v if isinstance(v, list) else [v])] for k, v in handled.items()}
            raw_attempts = data.get("attempts")
            tries = {}  # advisory: an entry that does not parse is dropped (its version starts counting again)
            for k, v in (raw_attempts.items() if isinstance(raw_attempts, dict) else []):
                if isinstance(v, list) and len(v) == 2 and isinstance(v[1], int) and not isinstance(v[1], bool):
                    tries[str(k)] = [_ts_key(_finite(v[0])), v[1]]
            return cls(updated_ts=float(ts) if ts is not None else None, last_id=data.get("last_id"),
                       handled=clean, overlap_s=overlap_s, attempts=tries)
        except (ValueError, AttributeError, TypeError):
            if warn:
                warn(f"Failed to interpret cursor {text[:80]!r}. Starting from scratch.")
            return cls(overlap_s=overlap_s)

    def dumps(self) -> str:
        data = {"updated_ts": self.updated_ts, "last_id": self.last_id, "handled": self.handled}
        if self.attempts:
            data["attempts"] = self.attempts
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def poll_from(self, default: float) -> float:
        """``start_updated_ts`` for the next poll (inclusive)."""
        return default if self.updated_ts is None else self.updated_ts - self.overlap_s

    def is_handled(self, record_id: str, updated_ts: float) -> bool:
        """True when this version was handled, or lies before the re-read window."""
        if self.updated_ts is not None and updated_ts < self.updated_ts - self.overlap_s:
            return True
        return _ts_key(updated_ts) in self.handled.get(record_id, [])

    def newest_handled(self, record_id: str) -> float | None:
        """The newest handled version of ``record_id`` still in the cursor, or None."""
        versions = self.handled.get(record_id)
        return max(float(v) for v in versions) if versions else None

    def record_failure(self, record_id: str, updated_ts: float) -> int:
        """Count one more failed try of this version; returns its tries so far (a new version starts at 1)."""
        prev = self.attempts.get(record_id)
        tries = prev[1] + 1 if prev is not None and prev[0] == _ts_key(updated_ts) else 1
        self.attempts[record_id] = [_ts_key(updated_ts), tries]
        return tries

    def tries(self, record_id: str, updated_ts: float) -> int:
        """Failed tries counted so far for this version (0 when none)."""
        prev = self.attempts.get(record_id)
        return prev[1] if prev is not None and prev[0] == _ts_key(updated_ts) else 0

    def advance(self, done: list[tuple[str, float]], failed: list[tuple[str, float]], *,
                ceiling: float | None = None) -> None:
        """Record one tick: ``done`` and ``failed`` are ``(id, updated_ts)`` of the records seen.

        The watermark moves to the newest done record, but never past the oldest failed one, and
        never above ``ceiling`` (the poll's end: a record claiming a future ``updated_ts`` must not
        make the next polls skip everything before it). Try counts are kept for the ``failed``
        versions only.
        """
        for rid, ts in done:
            self.handled.setdefault(rid, [])
            if _ts_key(ts) not in self.handled[rid]:
                self.handled[rid].append(_ts_key(ts))
        if failed:
            # stop at the oldest failure: the next poll re-reads it (inclusive), and the handled
            # set skips the records after it that were done
            oldest = min(failed, key=lambda r: (r[1], r[0]))[1]
            if ceiling is not None:
                oldest = min(oldest, ceiling)
            if self.updated_ts is None or oldest > self.updated_ts:
                self.updated_ts, self.last_id = oldest, None
        else:
            # nothing failed: everything read is handled, up to the newest handled version
            versions = [(float(v), rid) for rid, vs in self.handled.items() for v in vs]
            if versions:
                ts, rid = max(versions)
                if ceiling is not None and ts > ceiling:
                    ts, rid = ceiling, None
                if self.updated_ts is None or ts >= self.updated_ts:
                    self.updated_ts, self.last_id = ts, rid
        failing = {(rid, _ts_key(ts)) for rid, ts in failed}
        self.attempts = {rid: a for rid, a in self.attempts.items() if (rid, a[0]) in failing}
        if self.updated_ts is not None:
            floor = self.updated_ts - self.overlap_s
            pruned: dict[str, list[str]] = {}
            for rid, versions in self.handled.items():
                keep = [v for v in versions if float(v) >= floor]
                if keep:
                    pruned[rid] = keep
            self.handled = pruned
