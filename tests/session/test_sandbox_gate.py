"""A session under the sandbox governor (raygen.envs.fleet): it waits for its sandbox before its first
model call, brackets the start with the gate, and reports a backend's refusal so the governor learns."""

from __future__ import annotations

from typing import Any

from test_agent import ListModel, call, sample

from raygen.config import LocalEnvConfig, SessionConfig
from raygen.envs.fleet import SandboxRefused
from raygen.envs.local import LocalEnvironment
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry


class RecordingGate:
    def __init__(self, events: list[str]):
        self.events = events

    async def acquire(self, key: str) -> str:
        self.events.append(f"acquire {key}")
        return "permit"

    def started(self, permit: Any, *, ok: bool, refused: bool = False) -> None:
        self.events.append(f"started ok={ok} refused={refused}")

    def closed(self, permit: Any) -> None:
        self.events.append("closed")


class Recording(ListModel):
    def __init__(self, replies, events: list[str]):
        super().__init__(replies)
        self.events = events

    async def complete(self, messages, tools):
        self.events.append("model")
        return await super().complete(messages, tools)


def governed_runner(model, events: list[str], root) -> SessionRunner:
    return SessionRunner(
        model=model,
        registry=load_registry([]),
        env_config=LocalEnvConfig(root=root),
        session=SessionConfig(),
        sandbox_gate=RecordingGate(events),
        sandbox_key="local@node",
    )


async def test_a_governed_session_gets_its_sandbox_before_its_first_model_call(tmp_path):
    events: list[str] = []
    model = Recording(
        [
            {"role": "assistant", "tool_calls": [call("terminal", {"command": "echo hi"})]},
            {"role": "assistant", "content": "done"},
        ],
        events,
    )
    record = await governed_runner(model, events, tmp_path).run(sample())
    assert record.completed and record.tool_stats["terminal"].success == 1
    assert events == ["acquire local@node", "started ok=True refused=False", "model", "model", "closed"]
    assert list(tmp_path.iterdir()) == []


async def test_a_refused_start_fails_the_session_retryably_and_tells_the_gate(tmp_path, monkeypatch):
    async def refuse(self) -> None:
        raise SandboxRefused("env_start", "Sandbox creation rate limit (5/s) exceeded")

    monkeypatch.setattr(LocalEnvironment, "start", refuse)
    events: list[str] = []
    model = Recording([{"role": "assistant", "content": "never asked"}], events)
    record = await governed_runner(model, events, tmp_path).run(sample())
    assert record.exit_status == "error:env_start"
    assert events == ["acquire local@node", "started ok=False refused=True"]  # no model call, no close
