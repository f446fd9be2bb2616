#!/bin/bash
# Partial credit: the share of cases count_words() gets right, as reward.json.
cd /app
python3 - <<'PY'
import json

cases = [("a b  c", 3), ("", 0), ("  one  ", 1), ("x\ty\nz", 3)]
try:
    from solution import count_words
    right = sum(1 for text, want in cases if count_words(text) == want)
except Exception:
    right = 0
with open("/logs/verifier/reward.json", "w") as f:
    json.dump({"reward": right / len(cases)}, f)
PY
