"""Receipts: signed, chained records of what a repair did and how it was verified."""
