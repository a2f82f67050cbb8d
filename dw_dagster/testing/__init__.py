"""For demos and tests: protocol-accurate fake vendor servers (:mod:`.fakes`) and their processes
(:mod:`.services`), the in-process sensor runner (:mod:`.local_daemon`), and the demos' shared
harness (:mod:`.demo`)."""
