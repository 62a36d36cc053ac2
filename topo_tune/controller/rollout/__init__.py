"""Rollouts: a config version applied wave by wave (canary, then racks), gated by A/B verification.

``plan`` builds the waves, ``gates`` judges a wave, ``state`` is the persisted state machine's pure
transition logic, ``store`` persists it with an audit log, and ``engine`` reconciles it with the fleet.
"""
