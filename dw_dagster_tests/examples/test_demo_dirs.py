"""A home an example's code location made on load is the demo's to clear; anything else is refused.

Found by hand: ``make validate`` (``dagster definitions validate -w workspace.yaml``) loads the orders
location, whose ``ensure_home`` creates ``.dw_demo/orders/data``; ``make demo-orders`` then refused
the folder as "not empty and not made by the demo" until it was deleted by hand.
"""

import pytest

from dw_dagster_dev.demo import MARKER, DemoDirError, claim_demo_dir
from dw_dagster_examples.orders import home as orders_home
from dw_dagster_examples.store_sales import home as store_home


@pytest.mark.parametrize("ensure", [orders_home.ensure_home, store_home.ensure_home], ids=["orders", "store_sales"])
def test_a_home_made_by_the_location_is_claimed_by_the_demo(tmp_path, ensure):
    home = ensure(tmp_path / "home")
    assert (home / MARKER).exists() and any(p.name != MARKER for p in home.iterdir())
    claimed = claim_demo_dir(home)
    assert sorted(p.name for p in claimed.iterdir()) == [MARKER]


def test_an_existing_folder_is_not_marked_and_stays_refused(tmp_path):
    home = tmp_path / "mine"
    home.mkdir()
    (home / "notes.txt").write_text("someone's data")
    orders_home.ensure_home(home)
    assert not (home / MARKER).exists()
    with pytest.raises(DemoDirError, match="was not made by the demo"):
        claim_demo_dir(home)
    assert (home / "notes.txt").read_text() == "someone's data"
