"""Propose: turn a diagnosis into one change set (diff, bounded window, rebuild, test, undo)."""
