"""Remediation bots: they read fleetpulse's drain events and act on a scheduler (docs/remediation.md)."""
