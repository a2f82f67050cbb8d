"""Causes: each module tests one cause and reports evidence, confidence and the unexplained rest.

- :mod:`.watermark` — late rows behind a high-watermark (and rows tied with it)
- :mod:`.dead_letter` — NULLs in a REQUIRED column, dead-lettered or dropped
- :mod:`.schema_change` — columns added, dropped, renamed, retyped, nullability changed
- :mod:`.upstream` — an upstream asset not refreshed, or its runs failed
- :mod:`.duplicates` — duplicated merge keys, a partition loaded twice
"""
