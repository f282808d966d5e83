"""hf_hetspec.tools.runner: timing helpers of the methods the command line compares."""

from __future__ import annotations

import torch

from hf_hetspec.tools.runner import FirstTokenTimer


def test_first_token_timer_skips_the_prompt():
    timer = FirstTokenTimer()
    timer.put(torch.tensor([[1, 2, 3]]))
    assert timer.first_token_at is None
    timer.put(torch.tensor([4]))
    first = timer.first_token_at
    timer.put(torch.tensor([5]))
    assert first is not None and timer.first_token_at == first
