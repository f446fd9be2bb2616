"""Grading on the real local backend, through a whole session: rewards, hiding, tampering, errors."""

from __future__ import annotations

import json

import pytest

from raygen.config import LocalEnvConfig
from tests.verify.helpers import ToolScript, runner, sample_of, shell, solutions, task_rows, write

ENV = LocalEnvConfig()
ROW = task_rows()[0]
RIGHT = solutions()[ROW["id"]]
WRONG = ROW["prompt"].split(":\n\n", 1)[1]  # the bare signature and docstring: returns None


@pytest.mark.parametrize("mode", ["fresh", "same"])
async def test_right_solution_earns_1_and_wrong_earns_0(mode):
    good = await runner(ToolScript([[write("solution.py", RIGHT)]]), ENV).run(sample_of(ROW, mode=mode))
    bad = await runner(ToolScript([[write("solution.py", WRONG)]]), ENV).run(sample_of(ROW, mode=mode))
    assert good.exit_status == "completed" and good.reward == 1.0 and good.verification.passed
    assert good.verification.mode == mode and good.verification.exit_code == 0
    assert [a.path for a in good.artifacts] == ["solution.py"] and good.artifacts[0].content == RIGHT
    assert bad.exit_status == "completed" and bad.reward == 0.0 and not bad.verification.passed
    assert bad.verification.exit_code != 0 and "AssertionError" in bad.verification.output


@pytest.mark.slow
async def test_the_model_never_sees_the_hidden_files():
    hidden = ROW["verify"]["files"]["test_hidden.py"]
    model = ToolScript([[shell("ls -a; cat test_hidden.py; find / -name test_hidden.py 2>/dev/null | head")]])
    rec = await runner(model, ENV).run(sample_of(ROW, mode="same"))
    tool_output = next(m["content"] for m in rec.messages if m["role"] == "tool")
    assert "No such file" in tool_output
    assert "check(has_close_elements)" not in json.dumps(rec.messages)
    assert all("check(has_close_elements)" not in json.dumps(seen) for seen in model.seen)
    assert "def check" in hidden  # the file exists, and is only staged after the last turn
    assert rec.reward == 0.0  # no solution.py: the check ran and failed


@pytest.mark.parametrize("mode", ["fresh", "same"])
async def test_editing_or_deleting_the_tests_cannot_raise_the_reward(mode):
    cheats = [
        write("solution.py", WRONG),
        write("test_hidden.py", "print('all good')\n"),  # its own "test" under the hidden file's name
        write("reward.txt", "1.0\n"),
        shell("chmod 000 test_hidden.py; mkdir -p solution_tests"),
    ]
    rec = await runner(ToolScript([cheats]), ENV).run(sample_of(ROW, mode=mode))
    assert rec.exit_status == "completed" and rec.reward == 0.0 and not rec.verification.passed


async def test_fresh_mode_copies_only_the_artifacts():
    # A helper module the agent wrote next to its solution is not an artifact: in fresh mode it is gone.
    solution = "from helper import *\n"
    helper = RIGHT
    turns = [[write("solution.py", solution), write("helper.py", helper)]]
    fresh = await runner(ToolScript(turns), ENV).run(sample_of(ROW, mode="fresh"))
    same = await runner(ToolScript([list(t) for t in turns]), ENV).run(sample_of(ROW, mode="same"))
    assert fresh.reward == 0.0 and "No module named 'helper'" in fresh.verification.output
    assert same.reward == 1.0


async def test_a_verifier_timeout_is_a_failure_not_a_zero():
    rec = await runner(ToolScript([[write("solution.py", RIGHT)]]), ENV).run(
        sample_of(ROW, command="sleep 30", timeout_s=0.5)
    )
    assert rec.exit_status == "error:verify_error" and rec.reward is None
    assert "timed out" in rec.error and "timed out" in rec.verification.error
    assert rec.artifacts[0].content == RIGHT  # kept for rescore


async def test_missing_artifact_is_recorded_and_graded_as_it_is():
    rec = await runner(ToolScript([]), ENV).run(sample_of(ROW))  # answers without any tool call
    assert rec.reward == 0.0 and rec.verification.missing_artifacts == ["solution.py"]


@pytest.mark.parametrize(
    ("spec", "reward", "passed"),
    [
        ({"result": "last_line", "command": "echo running; echo 0.25"}, 0.25, False),
        ({"result": "reward_file", "command": "echo 1 > reward.txt"}, 1.0, True),
        (
            {
                "result": "reward_file",
                "reward_file": "out/r.json",
                "pass_threshold": 0.5,
                "command": "mkdir -p out; echo '{\"reward\": 0.5}' > out/r.json; exit 3",
            },
            0.5,
            True,
        ),
    ],
)
async def test_float_rewards(spec, reward, passed):
    rec = await runner(ToolScript([]), ENV).run(sample_of(ROW, **spec))
    assert rec.exit_status == "completed"
    assert (rec.reward, rec.verification.passed) == (reward, passed)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"result": "last_line", "command": "echo 1.5"}, "outside [0, 1]"),
        ({"result": "last_line", "command": "echo nan-ish"}, "not a number"),
        ({"result": "reward_file", "command": "true"}, "wrote no reward file"),
    ],
)
async def test_unreadable_rewards_are_verify_errors(spec, message):
    rec = await runner(ToolScript([]), ENV).run(sample_of(ROW, **spec))
    assert rec.exit_status == "error:verify_error" and rec.reward is None and message in rec.error


async def test_a_reward_file_left_by_the_agent_does_not_count():
    turns = [[write("reward.txt", "1\n")]]
    rec = await runner(ToolScript(turns), ENV).run(
        sample_of(ROW, result="reward_file", mode="same", command="true")
    )
    assert rec.exit_status == "error:verify_error" and rec.reward is None


async def test_the_config_default_check_applies_to_rows_without_one():
    from raygen.input.verify_spec import VerifySpec

    row = {k: v for k, v in ROW.items() if k != "verify"}
    r = runner(ToolScript([[write("solution.py", RIGHT)]]), ENV)
    r.verify_default = VerifySpec(**ROW["verify"])
    assert (await r.run(sample_of(row))).reward == 1.0
    own = dict(ROW, verify={**ROW["verify"], "command": "exit 1"})  # a row's own check wins
    r = runner(ToolScript([[write("solution.py", RIGHT)]]), ENV)
    r.verify_default = VerifySpec(**ROW["verify"])
    assert (await r.run(sample_of(own))).reward == 0.0
    assert (await runner(ToolScript([]), ENV).run(sample_of(row))).verification is None  # no check at all


@pytest.mark.parametrize("mode", ["fresh", "same"])
async def test_a_session_holds_one_sandbox_at_a_time(mode):
    counts, held = [], 0

    def on_sandbox(delta: int) -> None:
        nonlocal held
        held += delta
        counts.append(held)

    r = runner(ToolScript([[write("solution.py", RIGHT)]]), ENV)
    r.on_sandbox = on_sandbox
    rec = await r.run(sample_of(ROW, mode=mode))
    assert rec.reward == 1.0 and max(counts) == 1 and held == 0
    assert counts == ([1, 0, 1, 0] if mode == "fresh" else [1, 0])  # fresh: the agent's, then the check's


async def test_a_flaky_check_is_run_again_on_the_same_artifacts(tmp_path):
    # The check hangs the first time it runs and passes the next: a marker outside the sandbox counts runs.
    marker = tmp_path / "ran-once"
    flaky = f"if [ -e {marker} ]; then python3 test_hidden.py; else touch {marker}; sleep 30; fi"
    spec = {"command": flaky, "timeout_s": 1.0}
    once = await runner(ToolScript([[write("solution.py", RIGHT)]]), ENV).run(sample_of(ROW, **spec))
    assert once.exit_status == "error:verify_error" and "(1 run(s) of the check)" in once.error
    marker.unlink()
    twice = await runner(ToolScript([[write("solution.py", RIGHT)]]), ENV).run(
        sample_of(ROW, retries=1, **spec)
    )
    assert twice.exit_status == "completed" and twice.reward == 1.0


async def test_a_nul_inside_a_hidden_file_is_staged_byte_exact():
    # issue 28 case 8 names verify.files texts beside verify.command: a NUL in a command can start no
    # process (refused by validate, tests/input/test_validate_hostile.py); in a file it is only a byte.
    check = "python3 -c \"import sys; sys.exit(open('h.bin', 'rb').read() != b'a\\x00b')\""
    done = await runner(ToolScript([]), ENV).run(sample_of(ROW, files={"h.bin": "a\x00b"}, command=check))
    assert done.exit_status == "completed" and done.reward == 1.0, (done.error, done.verification)
