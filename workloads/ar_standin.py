"""Autoregressive stand-ins: the stage that runs before the tail in every SPEAK unit.

What to run, not how to measure: a stand-in is a published architecture config, built through the stock
transformers class with seeded random weights (no weights can be downloaded), generating the speech
tokens of one SPEAK unit with `generate`. Its output is discarded: the tail decodes the session script's
payload, so the tail's bytes stay comparable with the stock run; the stand-in only loads the device the
way the real AR stage does.

MiniCPM-o 4.5's TTS decoder (`minicpmo45_tts`): a Llama backbone. Hyperparameters from the
`MiniCPMTTSConfig` defaults of vllm-omni's MiniCPM-o 4.5 support ("Configuration for MiniCPMTTS -- the
Talker stage (Llama AR backbone)", `backbone_model="llama"`): nextain/vllm-omni @5a72a03
vllm_omni/model_executor/models/minicpm_o/configuration_minicpmo.py, `MiniCPMTTSConfig.__init__`:
hidden_size 768, intermediate_size 3072, 12 attention heads, 12 KV heads, 20 layers,
max_position_embeddings 4096, silu, num_audio_tokens 6562 (S3 tokenizer v2's 6561 ids + one end token),
num_vq 1. Not checked against the released checkpoint's config.json (no download here). Per SPEAK unit the duplex loop calls `tts.generate_chunk(max_new_token=26,
min_new_tokens=26)` (MiniCPM-o unified L5188-5212, shared/notes/stock_decoders.md section 2): 26 tokens.
Simplifications, said plainly: the condition (the LLM's merged text hidden states) is stood in for by
`prompt_tokens` audio-token ids per unit, and the KV cache is not carried from unit to unit (the real
TTS keeps it over a turn), so attention over a long turn history is not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StandIn:
    """One AR stand-in. config: transformers LlamaConfig kwargs; tokens_per_unit: new tokens per SPEAK
    unit; prompt_tokens: condition length per unit; source: where the hyperparameters come from."""
    name: str
    config: dict
    tokens_per_unit: int
    prompt_tokens: int
    source: str
    reduced: dict = field(default_factory=dict)   # overrides for CPU tests (same class, fewer layers)


MINICPMO45_TTS = StandIn(
    name="minicpmo45_tts",
    config=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_key_value_heads=12,
                num_hidden_layers=20, max_position_embeddings=4096, vocab_size=6562, hidden_act="silu",
                tie_word_embeddings=False),
    tokens_per_unit=26,
    prompt_tokens=16,
    source=("vllm-omni MiniCPMTTSConfig defaults for MiniCPM-o 4.5 (nextain/vllm-omni @5a72a03 "
            "vllm_omni/model_executor/models/minicpm_o/configuration_minicpmo.py; Llama AR backbone: hidden "
            "768, ffn 3072, 12 heads, 12 KV heads, 20 layers, 6562 audio tokens); 26 tokens per unit from "
            "generate_chunk(max_new_token=26) in MiniCPM-o unified L5188-5212"),
    reduced=dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                 num_hidden_layers=2),
)

STANDINS = {s.name: s for s in (MINICPMO45_TTS,)}

#: The stand-in `--ar standin` picks for a workload (by name); workloads not listed need `standin:<name>`.
DEFAULT_FOR = {"minicpmo45": "minicpmo45_tts", "minicpmo45_5step": "minicpmo45_tts"}


def get(name: str) -> StandIn:
    """The stand-in called `name`. Raises KeyError naming the known ones."""
    try:
        return STANDINS[name]
    except KeyError:
        raise KeyError(f"AR stand-in {name!r}: expected one of {sorted(STANDINS)}") from None


def build(standin: StandIn, *, device="cpu", depth: str = "released", seed: int = 0):
    """The stock `transformers.LlamaForCausalLM` from `standin.config` (reduced: with `standin.reduced`),
    seeded random weights (transformers' own initialiser after `torch.manual_seed(seed)`), float32, eval.
    Raises ValueError for an unknown depth."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if depth not in ("released", "reduced"):
        raise ValueError(f"depth: expected 'released' or 'reduced', got {depth!r}")
    kwargs = dict(standin.config)
    if depth == "reduced":
        kwargs.update(standin.reduced)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**kwargs))
    return model.float().to(device).eval()
