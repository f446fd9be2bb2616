"""The ``raygen report`` section of the last ``raygen export --check``: token counts per trajectory as the
chat template renders them, render failures, and whether the template gives the server's tokens."""

from __future__ import annotations

from typing import Any

from raygen.eval import svg
from raygen.eval.html import figure, kv_table, num, section, table


def template_check_section(check: dict[str, Any] | None) -> str:
    """Says how to get one for a run without a check (the navigation always links here)."""
    if not check:
        return section(
            "tokens",
            "Tokens",
            intro="No template check yet: raygen export RUN --to tokens --out DIR --tokenizer PATH --check "
            "renders every trajectory with the model's chat template (docs/exports.md).",
        )
    tokens = check.get("tokens") or {}
    hist = tokens.get("histogram") or {}
    used = [label for label, count in hist.items() if count] or list(hist)
    first, last = list(hist).index(used[0]), list(hist).index(used[-1])
    labels = list(hist)[first : last + 1]
    chart = svg.histogram(labels, [hist[label] for label in labels], label="tokens per trajectory")
    served = check.get("server_ids") or {}
    summary = kv_table(
        [
            ("tokenizer", check.get("tokenizer")),
            ("export", check.get("export")),
            ("rendered", f"{num(check.get('rendered'))} of {num(check.get('records'))}"),
            ("render failures", num(check.get("render_failures"))),
            (
                "tokens min / median / max",
                f"{tokens.get('min')} / {tokens.get('median')} / {tokens.get('max')}",
            ),
            (f"over max length ({check.get('max_length')})", num(check.get("over_max_length"))),
            ("same tokens as the server", f"{num(served.get('matched'))} of {num(served.get('compared'))}"),
        ]
    )
    failures = table(
        ["trajectory", "why the template failed"],
        [[e.get("id"), e.get("error")] for e in check.get("render_failure_examples") or ()],
        numeric_from=2,
    )
    mismatches = table(
        ["trajectory", "token", "rendered", "served"],
        [
            [e.get("id"), e.get("position"), e.get("rendered"), e.get("served")]
            for e in served.get("mismatch_examples") or ()
        ],
        numeric_from=1,
    )
    return section(
        "tokens",
        "Tokens",
        summary,
        figure("Tokens per trajectory (chat template)", chart),
        failures if check.get("render_failures") else "",
        mismatches if served.get("mismatched") else "",
    )
