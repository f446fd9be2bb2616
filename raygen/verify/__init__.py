"""Verified trajectories: a row's hidden check, graded after the session (see README.md here).

Kept import-free: ``raygen.input.rows`` imports ``raygen.verify.spec`` and must not pull in the backends.
"""
