"""Records read as a person reads them."""

import pytest

from dw_dagster.core.models import SliceGap, gap_words


@pytest.mark.parametrize(("rows", "pct", "words"), [
    (2124, 1.8, "2,124 rows short (1.80 %)"),
    (-12, -0.011, "12 rows over (0.01 %)"),
    (1, 0.5, "1 row short (0.50 %)"),
    (0, 0.0, "no row gap"),
    (3912, None, "3,912 rows short"),
])
def test_a_gap_reads_from_the_target_side(rows, pct, words):
    assert gap_words(rows, pct) == words


def test_a_slice_gap_in_words():
    sg = SliceGap(slice={"region": "Southwest"}, source_rows=118_000, target_rows=115_876, gap_rows=2124, gap_pct=1.8,
                  passed=False)
    assert sg.gap_words() == "2,124 rows short (1.80 %)"
