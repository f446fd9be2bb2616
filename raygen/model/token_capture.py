"""Token ids, logprobs and the model version of one chat completion, as far as the endpoint sent them.

What is asked for (``sampling.logprobs``, ``top_logprobs``, ``return_token_ids``) is added to each request
by ``request_fields``; ``capture`` reads the answer. OpenAI's fields: ``choices[0].logprobs.content``
(token, logprob, top_logprobs), ``model``, ``system_fingerprint``. vLLM's extension for token-in /
token-out training: ``prompt_token_ids`` on the response and ``token_ids`` on the choice.
"""

from __future__ import annotations

from typing import Any

from raygen.model.base import TokenCapture


def request_fields(sampling: Any) -> dict[str, Any]:
    """The request body's fields for what ``sampling`` (a SamplingConfig) asks to capture."""
    fields: dict[str, Any] = {}
    if sampling.logprobs or sampling.top_logprobs:
        fields["logprobs"] = True
        if sampling.top_logprobs:
            fields["top_logprobs"] = sampling.top_logprobs
    if sampling.return_token_ids:
        fields["return_token_ids"] = True
    return fields


def _extra(obj: Any) -> dict[str, Any]:
    return getattr(obj, "model_extra", None) or {}


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return list(value)


def _logprob_entries(choice: Any) -> list[Any]:
    logprobs = getattr(choice, "logprobs", None)
    return list(getattr(logprobs, "content", None) or [])


def capture(response: Any) -> TokenCapture:
    """What ``response`` (the SDK's ChatCompletion) says about tokens and the model that answered."""
    choice = response.choices[0]
    found = TokenCapture(
        model=getattr(response, "model", None) or None,
        system_fingerprint=getattr(response, "system_fingerprint", None) or None,
        prompt_token_ids=_int_list(_extra(response).get("prompt_token_ids")),
        token_ids=_int_list(_extra(choice).get("token_ids")),
    )
    try:
        _add_logprobs(found, _logprob_entries(choice))
    except (TypeError, ValueError, AttributeError):  # a malformed logprobs object: kept without them
        found.logprobs = found.tokens = found.top_logprobs = None
    return found


def _add_logprobs(found: TokenCapture, entries: list[Any]) -> None:
    if not entries:
        return
    found.logprobs = [float(e.logprob) for e in entries]
    if found.token_ids is None:  # without ids, the token texts are what aligns logprobs with text
        found.tokens = [str(e.token) for e in entries]
    if any(getattr(e, "top_logprobs", None) for e in entries):
        found.top_logprobs = [
            [{"token": str(t.token), "logprob": float(t.logprob)} for t in e.top_logprobs or ()]
            for e in entries
        ]
