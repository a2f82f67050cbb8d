"""Protocol-accurate fake vendor servers and the in-process sensor runner, for demos and tests."""
