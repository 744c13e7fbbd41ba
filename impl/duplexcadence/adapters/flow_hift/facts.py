"""Cited facts of the flow-matching DiT + HiFT tails: constants, the released configuration files, the drivers'
token loops, the regions and the stock tables that bound them per variant (host data only). Citations: "unified
Lx" = OpenBMB/minicpm-o-4_5-pytorch-simple-demo @c7e1660 MiniCPMO45/modeling_minicpmo_unified.py; "t2w Lx" /
"ex Lx" = stepfun-ai/Step-Audio2 @ b1bb23c4fd455dbbce8f1736c721411b3f5cf4c1 token2wav.py / examples-vllm-stream.py;
other files are minicpmo-utils 1.0.7's `stepaudio2` package.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

from duplexcadence.clocks import Clock, ClockError, Fixed, HeadTail, KeepAll, RegionSpec

VARIANTS = ("minicpmo45", "stepaudio2")
VOCAB_SIZE = 6561            # S3 tokenizer v2 codebook (flow.yaml vocab_size)
SILENCE_TOKEN = 4218         # unified L4408: a MiniCPM-o turn's buffer starts as [4218] * 3
PRE_LOOKAHEAD = 3            # flow.pre_lookahead_len (PreLookaheadLayer); ex L21
CHUNK_TOKENS = 25            # unified L5446ff CHUNK_SIZE = 25; ex L1 CHUNK_SIZE = 25
CALL_TOKENS = CHUNK_TOKENS + PRE_LOOKAHEAD      # 28: the longest stream call
#: The most speech tokens a SPEAK unit carries: unified L5188 runs `generate_chunk(max_new_token=25 + 1)`, which
#: returns `new_tokens[:, 0:t]`, t <= max_new_token - 1 (L6835). The workloads' payload format reads this.
MAX_UNIT_TOKENS = CHUNK_TOKENS
MIN_CALL_TOKENS = PRE_LOOKAHEAD + 5             # unified loop: `while len(buf) >= pre_lookahead + 5`
SAMPLE_RATE = 24000
HOP_SAMPLES = 480            # samples per 50 Hz mel frame
TAIL_FRAMES = 100            # the DiT trim keeps the newest P + the last 100 (token2wav.py L220-247, t2w L137-141)
N_TIMESTEPS = 10             # t2w L108, L135 (Step-Audio 2); MiniCPM-o's HF model file uses 10, the demo server 5
MEL_CACHE_LEN = 8            # t2w L53: HiFT mel overlap (Step-Audio 2)
SOURCE_CACHE_LEN = MEL_CACHE_LEN * HOP_SAMPLES  # 3840: t2w L54 (and MiniCPM-o's first-chunk silence, token2wav.py L214)
PROMPT_SECONDS = {"minicpmo45": 6.0, "stepaudio2": None}   # None: the whole clip
CHECKPOINT_FILES = ("flow.yaml", "flow.pt", "config.yaml", "hift.pt", "hift_original.pt")   # token2wav.py L100-104
#: The released stock tables, each a region bound (`regions`; `stock_limits` reads them from a model): the DiT
#: cache buffers' 1000 frames (flow_matching.py L35-36, decoder_dit.py L406-407), the encoder's position table
#: (EspnetRelPositionalEncoding max_len 5000, embedding.py L40-47), rand_noise's 600 s (flow_matching.py L33).
DIT_BUFFER_FRAMES, POSITION_TABLE, NOISE_FRAMES = 1000, 5000, 30000

CLOCKS = {c.name: c for c in (Clock("tokens", Fraction(25), "S3 speech tokens"), Clock("mel", Fraction(50), "mel frames"),
                               Clock("samples", Fraction(SAMPLE_RATE), "audio samples"))}

#: Released layer counts and the reduced CI configuration of the same classes (fewer flow layers, a narrower
#: causal vocoder with the released kernels, rates and history: every length is the released one).
RELEASED = {"num_blocks": 6, "num_up_blocks": 4, "dit_depth": 16, "vocoder_channels": 512, "f0_channels": 512}
REDUCED = {"num_blocks": 2, "num_up_blocks": 1, "dit_depth": 2, "vocoder_channels": 32, "f0_channels": 64}

# The released flow.yaml (MiniCPM-o-4_5/assets/token2wav/flow.yaml, Step-Audio-2-mini/token2wav/flow.yaml): the
# constructor contract vLLM-Omni validates it against (_FLOW_CONTRACT), stock_decoders.md 2.3; string.Template.
FLOW_YAML = """\
flow: !new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec {
    input_size: 512, output_size: 80, spk_embed_dim: 192, output_type: 'mel', vocab_size: 6561,
    encoder: !new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2 {
        input_size: 512, output_size: 512, input_layer: 'linear', pre_lookahead_len: 3, num_blocks: $num_blocks,
        num_up_blocks: $num_up_blocks, up_stride: 2, up_scale_factor: 2, attention_heads: 8,
        pos_enc_layer_type: 'rel_pos_espnet', selfattention_layer_type: 'rel_selfattn', key_bias: true,
        linear_units: 2048, dropout_rate: 0.1, positional_dropout_rate: 0.1, attention_dropout_rate: 0.1,
        normalize_before: true},
    decoder: !new:cosyvoice2.flow.flow_matching.CausalConditionalCFM {
        inference_cfg_rate: 0.7,
        estimator: !new:cosyvoice2.flow.decoder_dit.DiT {
            in_channels: 320, out_channels: 80, mlp_ratio: 4.0, depth: $dit_depth, num_heads: 8, head_dim: 64,
            hidden_size: 512}}}
"""

# The released config.yaml of the 1.0.7 causal vocoder: CosyVoice3 cosyvoice3.yaml's `hift:` block with the mel
# front end Token2wav asserts (token2wav.py L62-79); stock_decoders.md 2.5.
VOCODER_YAML = """\
sample_rate: 24000
feat_extractor: !name:matcha.utils.audio.mel_spectrogram {
    n_fft: 1920, num_mels: 80, sampling_rate: 24000, hop_size: 480, win_size: 1920, fmin: 0, fmax: 8000,
    center: false}
hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator {
    in_channels: 80, base_channels: $vocoder_channels, nb_harmonics: 8, sampling_rate: 24000, nsf_alpha: 0.1,
    nsf_sigma: 0.003, nsf_voiced_threshold: 10, upsample_rates: [8, 5, 3], upsample_kernel_sizes: [16, 11, 7],
    istft_params: {n_fft: 16, hop_len: 4}, resblock_kernel_sizes: [3, 7, 11],
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]], source_resblock_kernel_sizes: [7, 7, 11],
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]], lrelu_slope: 0.1, audio_limit: 0.99,
    conv_pre_look_right: 4,
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor {
        num_class: 1, in_channels: 80, cond_channels: $f0_channels}}
"""

#: Step-Audio 2's HiFT: t2w L45 builds `HiFTGenerator()` with no arguments, so its released configuration is
#: the class defaults of flashcosyvoice/modules/hifigan.py L80-99 (build.check_hift_config compares).
HIFT_CONFIG = {
    "in_channels": 80, "base_channels": 512, "nb_harmonics": 8, "sampling_rate": 24000,
    "nsf_alpha": 0.1, "nsf_sigma": 0.003, "nsf_voiced_threshold": 10,
    "upsample_rates": [8, 5, 3], "upsample_kernel_sizes": [16, 11, 7],
    "istft_params": {"n_fft": 16, "hop_len": 4},
    "resblock_kernel_sizes": [3, 7, 11], "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "source_resblock_kernel_sizes": [7, 7, 11],
    "source_resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "lrelu_slope": 0.1, "audio_limit": 0.99, "f0_predictor": None,
}
HIFT_REDUCED = dict(HIFT_CONFIG, base_channels=64, resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3, 5]])


@dataclass(frozen=True)
class Variant:
    """A variant's driver. start_buffer: the token buffer at a turn start (MiniCPM-o [4218] * 3, unified
    L4406-4410; Step-Audio 2 empty, ex L5); turn_state: "reset" or "carried" (Step-Audio 2's caches carry over
    turns, ex L59, L69); max_advance: the most mel frames a call adds; trims_conformer: MiniCPM-o 1.0.7 trims it
    as the DiT cache (token2wav.py L228-247), Step-Audio 2 never (t2w L137-141 trims the estimator only)."""
    name: str
    start_buffer: tuple
    turn_state: str
    max_advance: int
    trims_conformer: bool


VARIANT = {
    # a MiniCPM-o call has at most 28 tokens (50 frames); its final flush < 8 tokens (14 frames)
    "minicpmo45": Variant("minicpmo45", (SILENCE_TOKEN,) * PRE_LOOKAHEAD, "reset", 2 * CHUNK_TOKENS, True),
    # a Step-Audio 2 flush holds up to 27 tokens (fewer than 28 stay buffered): 54 frames
    "stepaudio2": Variant("stepaudio2", (), "carried", 2 * (CALL_TOKENS - 1), False),
}


class Call(NamedTuple):
    """One stream call: tokens buffer[start:start + n] (n = 0: an empty final call, vocoder flush only)."""
    start: int
    n: int
    last_chunk: bool


def plan_calls(variant: str, buffered: int, new: int, final: bool) -> tuple[list[Call], int]:
    """The driver's token loop on counts: the calls a unit of `new` tokens makes after `buffered` carried
    ones, and where the buffer left afterwards starts (an index into buffer + new tokens). Pure.

    minicpmo45 (unified L5446-5525, `force_flush` branch): `while len(buf) >= 8: n = min(28, len(buf));
    stream(buf[:n]); buf = buf[min(25, n - 3):]`; the turn's final unit streams the rest with last_chunk,
    even when empty (token2wav.py L271-273 flushes the vocoder). stepaudio2 (ex L20-27): `while len(buf)
    >= 28: stream(buf[:28]); buf = buf[25:]`; at the end of the turn a non-empty rest with last_chunk."""
    total, pos, calls = buffered + new, 0, []
    if variant == "minicpmo45":
        while total - pos >= MIN_CALL_TOKENS:
            n = min(CALL_TOKENS, total - pos)
            calls.append(Call(pos, n, False))
            pos += min(CHUNK_TOKENS, n - PRE_LOOKAHEAD)
        if final:
            calls.append(Call(pos, total - pos, True))
    else:
        while total - pos >= CALL_TOKENS:
            calls.append(Call(pos, CALL_TOKENS, False))
            pos += CHUNK_TOKENS
        if final and total > pos:
            calls.append(Call(pos, total - pos, True))
    return calls, (total if final else pos)


def mel_advance(n_tokens: int, last_chunk: bool) -> int:
    """Mel frames a call adds: 2(n - 3) (the lookahead is dropped), or 2n for last_chunk (3 zero frames padded
    instead; upsample_encoder_v2.py forward_chunk L408-481)."""
    return 2 * n_tokens if last_chunk else 2 * (n_tokens - PRE_LOOKAHEAD)


class StockLimits(NamedTuple):
    """The stock tables of one built flow, in mel frames (see DIT_BUFFER_FRAMES)."""
    dit_frames: int
    positions: int
    noise_frames: int


def stock_limits(flow) -> StockLimits:
    """Read the tables from the modules: the DiT cache buffers' frame axis (CFM dim 4, DiT dim 3), the
    position table's largest relative size (pe.size(1) + 1) / 2 (embedding.py L47, L115-118; both conformer
    stacks read `encoder.embed`'s table, upsample_encoder_v2.py L440, L463), the noise table's frames."""
    cfm = flow.decoder
    return StockLimits(min(cfm.att_cache_buffer.shape[4], cfm.estimator.att_cache_buffer.shape[3]),
                       (int(flow.encoder.embed.pos_enc.pe.size(1)) + 1) // 2, int(cfm.rand_noise.shape[2]))


def regions(variant: str, prompt_frames: int, limits: StockLimits) -> list[RegionSpec]:
    """The flow's regions for a voice of P mel frames (mel frames along the stock axis). conformer_att
    (layers, 1, 8, L, 128), oldest-first, token-rate layers as [cache, cache]: minicpmo45 HeadTail(P, 100, 50)
    (token2wav.py L228-247), stepaudio2 KeepAll(position table) (a call reads L + advance positions).
    estimator_att (steps, 16, 2, 8, L, 128), newest-first: HeadTail(P, 100, max advance) (token2wav.py L220-226,
    t2w L137-141). Conv caches fixed. A prompt whose regions would cross a stock table is refused here, before
    any session runs: ClockError (session_usable False) naming the table and the longest prompt the model takes.
    ValueError for an odd P."""
    P, v = int(prompt_frames), VARIANT[variant]
    if P % 2 or P < 2:
        raise ValueError(f"prompt_frames: expected an even mel-frame count >= 2 (2 x tokens), got {P}")
    conf = HeadTail(P, TAIL_FRAMES, v.max_advance) if v.trims_conformer else KeepAll(limits.positions)
    specs = [RegionSpec("conformer_att", "mel", P, conf, axis=3),
             RegionSpec("estimator_att", "mel", P, HeadTail(P, TAIL_FRAMES, v.max_advance), axis=4),
             RegionSpec("conformer_cnn", "mel", 6, Fixed(6), axis=2),
             RegionSpec("estimator_cnn", "mel", 2, Fixed(2), axis=4)]
    caps = {"conformer_att": [("the encoder's relative-position table (embedding.py L40-47)", limits.positions)],
            "estimator_att": [("the stock DiT cache buffers (flow_matching.py L35-36)", limits.dit_frames),
                              ("the flow's noise table (flow_matching.py L33)", limits.noise_frames)]}
    for spec in specs[:2]:
        reach = spec.policy.bound() if isinstance(spec.policy, HeadTail) else P + v.max_advance
        for what, cap in caps[spec.name]:
            if reach > cap:
                longest = cap - (reach - P)
                raise ClockError(f"voice prompt of {P} mel frames ({P / 50:.2f} s): region {spec.name!r} would "
                                 f"reach {reach} frames, past {what} of {cap}; this model takes prompts of at "
                                 f"most {longest} frames ({longest / 50:.2f} s)", session_usable=False)
    return specs
