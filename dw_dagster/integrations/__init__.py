"""Vendors: Lightup, PagerDuty, Opsgenie, Slack, and the notification sensor."""
