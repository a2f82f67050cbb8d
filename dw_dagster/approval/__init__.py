"""Approve: a verified person's single decision on a change set's exact content."""
