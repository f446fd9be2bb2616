"""Token ids, logprobs and model versions captured per turn, through the real HTTP simulator and the
openai SDK; and the loss mask of each record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raygen.config import (
    FakeEnvConfig,
    ProviderConfig,
    SamplingConfig,
    SessionConfig,
    SimConfig,
    SimModelConfig,
)
from raygen.formats.chat_template import load_tokenizer, render_ids
from raygen.formats.token_ids import full_prompts
from raygen.model.openai_model import OpenAIChatModel
from raygen.session.agent import SessionRunner
from raygen.sim.server import SimServer
from raygen.tools.registry import load_registry
from tests.session.test_agent import ListModel, call, runner, sample

TOKENIZER = str(Path(__file__).resolve().parents[1] / "data" / "tiny-chat-tokenizer")
CAPTURE = SamplingConfig(logprobs=True, top_logprobs=2, return_token_ids=True)


async def _session(sim_cfg: SimConfig, sampling: SamplingConfig, provider=None, **session):
    async with SimServer(sim_cfg) as sim:
        model = OpenAIChatModel(SimModelConfig(), sampling, api_key="x", base_url=sim.url, provider=provider)
        try:
            return await runner(model, **session).run(sample("List the files here."))
        finally:
            await model.aclose()


@pytest.mark.parametrize("stream", [False, True])
async def test_ids_and_logprobs_captured_per_turn(stream):
    provider = ProviderConfig(stream=True) if stream else None
    rec = await _session(SimConfig(latency_s=0.0), CAPTURE, provider)
    assert rec.completed and len(rec.turns) == rec.api_calls >= 3
    for turn in rec.turns:
        assert turn.token_ids and len(turn.logprobs) == len(turn.token_ids)
        assert all(lp <= 0 for lp in turn.logprobs)
        assert [len(alts) for alts in turn.top_logprobs] == [2] * len(turn.token_ids)
        assert turn.tokens is None  # ids came, so the token texts are not kept
        assert turn.model == "raygen-sim" and turn.system_fingerprint == "raygen-sim-0"
    # Later prompts are stored from where they extend the previous prompt + reply: linear, not quadratic.
    assert rec.turns[0].prompt_token_ids_from == 0
    assert all(t.prompt_token_ids_from > 0 for t in rec.turns[1:])
    prompts = full_prompts([t.model_dump() for t in rec.turns])
    # The simulator counts the ids it sent in its usage: the reconstructed prompts are exactly those.
    assert sum(len(p) for p in prompts) == rec.usage.prompt_tokens
    assert sum(len(t.token_ids) for t in rec.turns) == rec.usage.completion_tokens
    stored = sum(len(t.prompt_token_ids) for t in rec.turns)
    assert stored < sum(len(p) for p in prompts)


async def test_streamed_and_plain_answers_capture_the_same_ids():
    plain = await _session(SimConfig(latency_s=0.0), CAPTURE)
    streamed = await _session(SimConfig(latency_s=0.0), CAPTURE, ProviderConfig(stream=True))
    assert [t.token_ids for t in plain.turns] == [t.token_ids for t in streamed.turns]
    assert [t.prompt_token_ids for t in plain.turns] == [t.prompt_token_ids for t in streamed.turns]
    assert [t.logprobs for t in plain.turns] == [t.logprobs for t in streamed.turns]


async def test_nothing_asked_nothing_captured_but_the_model():
    rec = await _session(SimConfig(latency_s=0.0), SamplingConfig())
    assert rec.completed
    for turn in rec.turns:
        assert turn.token_ids is turn.prompt_token_ids is turn.logprobs is turn.top_logprobs is None
        assert turn.model == "raygen-sim"


async def test_logprobs_without_ids_keep_the_token_texts():
    rec = await _session(SimConfig(latency_s=0.0), SamplingConfig(logprobs=True))
    for turn in rec.turns:
        assert turn.token_ids is None and turn.top_logprobs is None
        assert turn.tokens and len(turn.tokens) == len(turn.logprobs)


async def test_tokenizer_ids_are_what_the_chat_template_renders():
    """With ``sim.tokenizer`` the simulator answers as vLLM serving that model: the last prompt's ids and
    the last reply's are exactly the stored conversation rendered with the model's template."""
    rec = await _session(SimConfig(latency_s=0.0, tokenizer=TOKENIZER, reasoning_style="field"), CAPTURE)
    assert rec.completed
    tokenizer = load_tokenizer(TOKENIZER)
    prompts = full_prompts([t.model_dump() for t in rec.turns])
    schemas = [{"type": "function", "function": s} for s in _offered(rec)]
    rendered = render_ids(tokenizer, rec.messages, schemas, generation_prompt=False)
    captured = prompts[-1] + rec.turns[-1].token_ids
    assert rendered[: len(captured)] == captured
    assert tokenizer.decode(rendered[len(captured) :]) == "\n"  # the template's glue after the last turn
    assert rec.turns[-1].token_ids[-1] == tokenizer.eos_token_id


def _offered(rec):
    system = rec.conversations[0]["value"]
    return json.loads(system[system.rfind("<tools>\n") + 8 : system.rfind("\n</tools>")])


async def test_loss_mask_trains_on_replies_only():
    model = ListModel(
        [
            {"role": "assistant", "content": "", "tool_calls": [call("terminal", {"command": "ls"})]},
            {"role": "assistant", "content": "done"},
        ]
    )
    rec = await runner(model, system_prompt="be brief").run(sample())
    roles = [m["role"] for m in rec.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert rec.loss_mask == [0, 0, 1, 0, 1]


async def test_loss_mask_leaves_out_prefill_and_a_cut_reply(tmp_path):
    prefill = tmp_path / "prefill.json"
    turns = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    prefill.write_text(json.dumps(turns))
    rec = await _session(
        SimConfig(latency_s=0.0),
        SamplingConfig(max_tokens=5),
        prefill_messages_file=prefill,
        store_prefill=True,
    )
    assert rec.exit_status == "truncated"
    assert [m["role"] for m in rec.messages] == ["user", "assistant", "user", "assistant"]
    assert rec.loss_mask == [0, 0, 0, 0]  # prefill is not the model's; the cut reply stops mid-thought


async def test_redacted_record_drops_its_token_ids():
    """A secret in the text is redacted; its ids would still spell it, so they go (logprobs stay)."""
    secret = "sk-live-0123456789abcdef"
    async with SimServer(SimConfig(latency_s=0.0)) as sim:
        model = OpenAIChatModel(SimModelConfig(), CAPTURE, api_key="x", base_url=sim.url)
        r = SessionRunner(
            model=model,
            registry=load_registry([]),
            env_config=FakeEnvConfig(),
            session=SessionConfig(),
            secret_values=[secret],
        )
        rec = await r.run(sample(f"My key is {secret}, list the files."))
        await model.aclose()
    assert secret not in rec.model_dump_json()
    assert all(t.token_ids is None and t.prompt_token_ids is None for t in rec.turns)
    assert all(t.logprobs for t in rec.turns)


def test_capture_options_enter_the_fingerprint_only_when_set():
    """Runs made before the options existed keep their fingerprint (and resume); turning capture on is a
    different generation config."""
    from raygen.config import RunConfig
    from raygen.run.generation import Generation

    plain = Generation.build(RunConfig())
    assert not {"logprobs", "top_logprobs", "return_token_ids"} & set(plain.settings["sampling"])
    capturing = Generation.build(RunConfig.model_validate({"sampling": {"return_token_ids": True}}))
    assert capturing.settings["sampling"]["return_token_ids"] is True
    assert capturing.fingerprint != plain.fingerprint


async def test_a_simulator_whose_tokenizer_cannot_load_does_not_start(tmp_path):
    from raygen.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        async with SimServer(SimConfig(tokenizer=str(tmp_path / "missing"))):
            pass


async def test_captured_tokens_count_toward_the_record_size_limit():
    """A short conversation with a huge capture is over ``max_record_bytes`` too: it fails as too large,
    without its conversation and token data, instead of being stored at any size."""
    from raygen.model.base import ChatModel, Completion, TokenCapture

    class BigCapture(ChatModel):
        name = "big"

        async def complete(self, messages, tools):
            ids = list(range(100_000, 130_000))
            tokens = TokenCapture(
                token_ids=ids, logprobs=[-0.123456789012345] * len(ids), prompt_token_ids=ids
            )
            return Completion({"role": "assistant", "content": "hi"}, finish_reason="stop", tokens=tokens)

    rec = await runner(BigCapture(), max_record_bytes=256 * 1024).run(sample())
    assert rec.exit_status == "error:record_too_large"
    assert rec.messages == [] and rec.loss_mask == []
    assert all(t.token_ids is None and t.logprobs is None for t in rec.turns)
    assert len(rec.model_dump_json()) < 256 * 1024


def test_malformed_token_fields_are_left_out_not_fatal():
    """An endpoint's broken extension fields cost the capture, never the session."""
    from openai._models import construct_type
    from openai.types.chat import ChatCompletion

    from raygen.model.token_capture import capture

    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "prompt_token_ids": [1, "two", 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
                "token_ids": "not a list",
                "logprobs": {
                    "content": [{"token": "hi", "logprob": None, "bytes": None, "top_logprobs": []}]
                },
            }
        ],
    }
    # as the SDK reads a response (without strict validation)
    found = capture(construct_type(type_=ChatCompletion, value=body))
    assert found.model == "m"
    assert found.prompt_token_ids is None and found.token_ids is None and found.logprobs is None
