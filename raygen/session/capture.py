"""What a session keeps of one model call besides the reply: its ``TurnInfo`` (finish reason, provider,
model version, and the token ids and logprobs the response carried; docs/exports.md)."""

from __future__ import annotations

from raygen.formats.records import TopLogprob, TurnInfo
from raygen.formats.token_ids import stored_prompt_ids
from raygen.model.base import Completion


class TurnCapture:
    """Builds each turn's ``TurnInfo``; remembers the previous prompt + reply ids, so a prompt that
    extends them is stored from where it differs (raygen.formats.token_ids)."""

    def __init__(self) -> None:
        self.context: list[int] | None = None

    def turn(self, completion: Completion) -> TurnInfo:
        info = TurnInfo(finish_reason=completion.finish_reason, provider=completion.extra.get("provider"))
        found = completion.tokens
        if found is None:
            return info
        info.model, info.system_fingerprint = found.model, found.system_fingerprint
        info.token_ids, info.logprobs, info.tokens = found.token_ids, found.logprobs, found.tokens
        if found.top_logprobs is not None:
            info.top_logprobs = [[TopLogprob(**alt) for alt in alts] for alts in found.top_logprobs]
        if found.prompt_token_ids is not None:
            info.prompt_token_ids, info.prompt_token_ids_from = stored_prompt_ids(
                found.prompt_token_ids, self.context
            )
        if found.prompt_token_ids is None or found.token_ids is None:
            self.context = None
        else:
            self.context = found.prompt_token_ids + found.token_ids
        return info
