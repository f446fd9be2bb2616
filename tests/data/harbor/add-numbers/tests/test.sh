#!/bin/bash
# Reward 1 when solution.py's add() is right on every case, else 0.
cd /app
if PYTHONPATH=/app python3 /tests/test_add.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
