"""--samples-per-prompt: K samples per row, each its own key, sharing group_id and the row's tools."""

from __future__ import annotations

from raygen.input.validate import group_sample_keys, iter_samples
from tests.verify.helpers import TASKS


class Draw:
    def __init__(self):
        self.keys = []

    def draw(self, run_seed, sample_key):
        self.keys.append(sample_key)
        return [f"set-{sample_key[:4]}"]


def test_k_samples_per_row_with_their_own_keys():
    single = list(iter_samples(TASKS, run_seed=0, distribution=Draw(), limit=3))
    draw = Draw()
    grouped = list(iter_samples(TASKS, run_seed=0, distribution=draw, limit=3, samples_per_prompt=4))
    assert len(grouped) == 12 and len({s.sample_key for s in grouped}) == 12
    assert [s.sample_index for s in grouped] == [0, 1, 2, 3] * 3
    for row_sample, group in zip(single, (grouped[i : i + 4] for i in range(0, 12, 4)), strict=True):
        assert row_sample.group_id is None and row_sample.sample_index == 0
        # sample 0 keeps the row's key, so a K=1 run resumed with K=4 keeps what it has
        assert group[0].sample_key == row_sample.sample_key == group[0].group_id
        assert {s.group_id for s in group} == {row_sample.sample_key}
        assert {s.prompt_index for s in group} == {row_sample.prompt_index}
        assert {tuple(s.toolsets) for s in group} == {(f"set-{row_sample.sample_key[:4]}",)}
    assert len(draw.keys) == 3  # one toolset draw per row


def test_group_keys_are_stable():
    keys = group_sample_keys("a" * 24, 3)
    assert keys[0] == "a" * 24 and keys == group_sample_keys("a" * 24, 3)
    assert group_sample_keys("a" * 24, 5)[:3] == keys  # growing K adds samples, keeps the others
