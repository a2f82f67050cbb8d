"""Detect: the sensors that turn a failed check, a Lightup incident or a volume drop into one incident."""
