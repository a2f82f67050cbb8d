"""Changes: what a change set is made of, shared by proposals, repair and MCP (migrations, replay
plans, steps and their runners, manual steps)."""
