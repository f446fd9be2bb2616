"""Verified trajectories: a row's hidden check, graded after the session (see README.md here).

Kept import-free, so that importing ``raygen.verify.grader`` pulls in only what the grader needs.
"""
