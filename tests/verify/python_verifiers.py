"""Python verifiers used by test_python_verifier.py (loaded by import path, like a user's)."""

from __future__ import annotations

import time

from raygen.verify.python import PythonCheck


async def runs_hidden_test(check: PythonCheck) -> float:
    result = await check.env.exec("python3 test_hidden.py", 30, 10_000)
    return 1.0 if result.exit_code == 0 else 0.0


def answer_mentions_done(check: PythonCheck) -> bool:
    last = check.messages[-1].get("content") or ""
    return "done" in last


def too_slow(check: PythonCheck) -> float:
    time.sleep(2)
    return 1.0


def raises(check: PythonCheck) -> float:
    raise RuntimeError("verifier bug")


def out_of_range(check: PythonCheck) -> float:
    return 3.0


async def judge_says_yes(check: PythonCheck) -> float:
    """Asks the session's model (the simulator's scripted policy here) and grades by its answer."""
    reply = await check.model.complete([{"role": "user", "content": "Is the answer right? Say yes."}], [])
    return 1.0 if reply.message.get("content") else 0.0


def has_no_model(check: PythonCheck) -> bool:
    return check.model is None
