"""What the flow_hift test modules share: the committed voice prompts, seeded token units, the reduced-depth models
(2 s voice prompt, seed 0) and a module fixture `model` of each variant (a module imports it by name:
`from reduced_flow_hift import model`)."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from duplexcadence.adapters import flow_hift as fh  # noqa: E402
from duplexcadence.adapters.flow_hift import facts  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "workloads" / "data" / "voice_prompts"
VOICES = {"minicpmo45": DATA / "ljspeech_LJ001-0001_24k.wav",
          "stepaudio2": DATA / "librispeech_8297-275156-0011_24k.wav"}


def token_maker(base: int) -> Callable[[int, int], list[int]]:
    """tokens_for(unit, n): n token ids in [0, VOCAB_SIZE) from a generator seeded base + unit (a module picks its
    own base, so its units differ from other modules')."""
    def tokens_for(unit: int, n: int) -> list[int]:
        return torch.randint(0, facts.VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(base + unit)).tolist()
    return tokens_for


def reduced_model(variant: str, *, device: str = "cpu", n_timesteps: int = 2) -> fh.Model:
    """The reduced-depth model of `variant` with its committed voice prompt cut to 2 s, seed 0."""
    return fh.build_model({"variant": variant, "n_timesteps": n_timesteps, "voice_prompt": str(VOICES[variant]),
                           "prompt_seconds": 2.0}, device=device, depth="reduced", seed=0)


@pytest.fixture(scope="module", params=facts.VARIANTS)
def model(request):
    """The reduced model of each variant in turn (2 Euler steps), for the importing module's tests."""
    return reduced_model(request.param)
