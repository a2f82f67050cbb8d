"""Protocol-accurate fake servers of the vendor APIs dw_dagster talks to, for tests and the demo."""
