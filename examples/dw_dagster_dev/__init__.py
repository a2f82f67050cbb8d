"""For demos and tests, outside the ``dw-dagster`` wheel: protocol-accurate fake vendor servers
(:mod:`.fakes`) and their processes (:mod:`.services`), and the demos' shared harness (:mod:`.demo`).
Installed with the examples (``pip install -e examples``, the ``dw-dagster-examples`` distribution)."""
