"""DuplexCadence session for the flow + causal HiFT tail (MiniCPM-o 4.5, minicpmo-utils==1.0.7).

Same kernels as the stock session: `CausalMaskedDiffWithXvec.inference_chunk` (flow.py L172-229) and
`Token2wav._stream_vocode` (token2wav.py L206-218) are called as they ship. What changes is the glue:

* State lives in the session's arena at addresses that never move, sized from the clocks
  (flow_hift.regions): the conformer KV cache (10,1,8,<=P+150,128), the DiT KV cache of the Euler steps
  in use only (steps,16,2,8,<=P+150,128) instead of the stock 16-step x 1000-frame module buffer
  (2 GiB), the DiT per-step scratch (16,2,8,<=P+150,128) instead of its 1000-frame buffer, conv caches.
  The stock CFM/DiT write into their `att_cache_buffer`/`cnn_cache_buffer` module buffers; for the
  duration of a cadence step those buffers are the session's arena views (`_bound`).
* The stock trims (`Token2wav._trim_estimator_cache` / `_trim_conformer_cache`, token2wav.py L220-247:
  a fresh `torch.cat` of up to 16 x 16 x 2 x 8 x (P+100) x 128 floats every unit) become in-place
  shifts inside the arena that leave exactly the stock logical layout (newest-first DiT keys: keep the
  newest P frames and the last 100; oldest-first conformer keys: prompt + last 100 mel frames, the
  token-rate layers trimmed at token rate and repacked as [cache, cache]).
* On CUDA each exact shape signature of the flow step (tokens, last_chunk, conformer and DiT KV lengths
  from the clocks) is captured once as a CUDA graph (duplexcadence.graphs) and replayed; the token ids
  are copied into a static buffer outside the graph. The DiT timestep embedding builds its frequency
  table on the host and copies it to the device every call (decoder_dit.py L177-195), which cannot be
  captured; during a cadence step `t_embedder.timestep_embedding` computes the same table the same way
  once and keeps it on the device (same bytes; tests compare). The flow step writes its mel into the
  arena (`flow_mel`), where the vocoder reads it block by block.
* The vocoder runs on the arena too (bounded_vocoder_cadence.ArenaVocoder: mel/source history, phase, host
  offsets; one graph per 16-frame block signature, torch.istft eager between them). `vocoder="stock"`
  keeps the stock eager BoundedVocoder instead (for measurement).
* `prepare()` (run at session open on CUDA) captures a voice's turn-start, ramp and steady graphs with
  synthetic turns before the first real one; start_turn() restores the voice state afterwards.
  `rehearse(turns)` does the same for a given set of turn shapes (token counts per unit, each turn
  flushed) -- every signature a session script will produce, known from its counts alone
  (`rehearsal_turns`) -- and can then freeze the graph set, so the live cadence never captures.
* Many sessions of one model on many host threads (suite.duplex's "threads" policy): replays touch no
  Python state of the shared model; every eager run and capture (which point the shared CFM/DiT buffers
  at the session's arena for the step, `_bound`) holds the model's lock, and a signature warmed by one
  session is captured by the next on first occurrence (GraphCache `lock`, `warmed`).

Bit-exactness: every unit's float32 waveform and int16 PCM equal the stock session's (tests/ and the
suite's verify mode check every unit).
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager

import numpy as np
import torch

from duplexcadence.adapters import flow_hift as fh
from duplexcadence.adapters.bounded_vocoder_cadence import ArenaVocoder
from duplexcadence.arena import Arena
from duplexcadence.clocks import ClockError
from duplexcadence.graphs import GraphCache
from duplexcadence.errors import InputError
from duplexcadence.runtime import model_state
from duplexcadence.session import UnitOutput


class _DeviceTimestepTable:
    """`TimestepEmbedder.timestep_embedding` with its frequency table built once per device.

    Same expression as decoder_dit.py L186-195: the table is computed on the host exactly as stock
    does and moved once; stock moves it every call (a host-to-device copy that blocks capture).
    """

    def __init__(self):
        self.tables = {}

    def __call__(self, t, dim, max_period=10000):
        half = dim // 2
        key = (t.device, t.dtype, dim, max_period)
        freqs = self.tables.get(key)
        if freqs is None:
            freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half) / half).to(t)
            self.tables[key] = freqs
        args = t[:, None] * freqs[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
        return embedding


def flow_layout(flow) -> tuple[int, int, int, int, int, torch.dtype]:
    """The flow's cache geometry: (token-rate conformer layers, all conformer layers, DiT cache layer
    slots, attention heads, 2 x head dim (keys and values side by side), parameter dtype).
    The stock DiT/CFM buffers have 16 layer slots whatever the DiT depth (decoder_dit.py L406-407,
    flow_matching.py L35-36) and the caches they return carry all 16; the slots are read from them."""
    n_token = len(flow.encoder.encoders)
    depth = flow.decoder.estimator.att_cache_buffer.shape[0]
    return n_token, n_token + len(flow.encoder.up_encoders), depth, 8, 128, next(flow.parameters()).dtype


def voice_base(t2w, prompt: fh.Prompt, n_steps: int) -> tuple[dict, dict]:
    """The voice's stream caches right after `Token2wav.set_stream_cache` (token2wav.py L192-204): flow
    caches (estimator caches cut to the `n_steps` Euler steps in use) and the vocoder's reset cache dict.
    Computed once per (model, voice, steps) and kept on the model; sessions copy from it at start_turn
    and never write to it. Returns (flow caches by stock name, vocoder cache dict). The CFM/DiT write the
    set-up's KV into whatever their cache buffers are at the time (a session binds its arena views).
    Kept in `runtime.model_state(t2w)`, not on the model (a deep copy of the model starts without it)."""
    bases = model_state(t2w).setdefault("voice_base", {})
    key = (prompt.key, n_steps)
    if key not in bases:
        flow_cache, hift_cache = t2w.set_stream_cache(prompt.key)
        flow = {k: (v[:n_steps] if k.startswith("estimator") else v).clone() for k, v in flow_cache.items()}
        bases[key] = (flow, fh.clone_recursive(hift_cache))
        # set_stream_cache left the stock CFM buffers holding this voice; cadence never reads them.
    return bases[key]


def release_stock_buffers(t2w) -> int:
    """Free the stock module buffers DuplexCadence never reads: the CFM's 16-step x 1000-frame DiT KV
    buffer [16, 16, 2, 8, 1000, 128] and conv buffer (flow_matching.py L35-36) and the DiT's per-step
    scratch [16, 2, 8, 1000, 128] (decoder_dit.py L406-407): 2.1 GiB in float32. They stay as zero-stride
    tensors of the same shapes (4 bytes each), so shape reads keep working; cadence sessions bind their
    arena views over them for every step. For a process that runs only cadence sessions on this model:
    stock sessions cannot run on it afterwards (flow_hift.StockSession raises). Returns the bytes freed."""
    cfm = t2w.flow.decoder
    freed = 0
    for mod in (cfm, cfm.estimator):
        for name in ("att_cache_buffer", "cnn_cache_buffer"):
            buf = mod._buffers[name]
            if buf.stride() == (0,) * buf.ndim:
                continue
            freed += buf.numel() * buf.element_size()
            mod._buffers[name] = torch.zeros((), dtype=buf.dtype, device=buf.device).expand(buf.shape)
    t2w.stock_buffers_released = True
    if freed and torch.device(t2w.device).type == "cuda":
        torch.cuda.empty_cache()
    return freed


def model_lock(t2w) -> threading.RLock:
    """The lock shared by every cadence session of this model instance: held for eager runs and captures
    (which bind the shared module buffers to one session's arena), never for a replay. Kept in
    `runtime.model_state(t2w)`: a deep copy of the model (stock's instance per session) gets its own."""
    return model_state(t2w).setdefault("lock", threading.RLock())


def warmed_signatures(t2w, key) -> set:
    """Signatures whose eager warm-up already ran in this process, per model instance and `key`
    (Euler steps, vocoder kind, noise): shared by the sessions' graph caches (GraphCache `warmed`)."""
    return model_state(t2w).setdefault("warmed", {}).setdefault(key, set())


def rehearsal_turns(turns, steady_units: int | None = None) -> list[tuple[int, ...]]:
    """The distinct turn shapes that produce every signature of `turns`, each as short as possible.

    turns: an iterable of turns, each a sequence of token counts per SPEAK unit (the last one is the turn's
    final, flushed unit). Shapes depend on counts only (the clocks: tokens -> mel frames -> cache lengths),
    and a run of equal counts stops producing new signatures once both KV caches sit at their retention
    cap (P + 100 mel frames, reached after ceil(100 / 50) + 1 full units) and the vocoder's block plan
    repeats: `STEADY_UNITS` equal units. So every run of equal counts longer than that (the final unit
    excluded) is cut to that length, then duplicates are dropped (order kept).
    Returns a list of tuples of ints. Raises ValueError for turns that are not an iterable of sequences,
    an empty turn, a count outside [0, CHUNK_TOKENS + 1] (numpy ints count as ints) or a bad steady_units."""
    steady = STEADY_UNITS if steady_units is None else steady_units
    if isinstance(steady, (bool, np.bool_)) or not isinstance(steady, (int, np.integer)) or steady < 1:
        raise ValueError(f"steady_units: expected an int >= 1, got {steady!r}")
    if isinstance(turns, (str, bytes)) or not hasattr(turns, "__iter__"):
        raise ValueError(f"turns: expected an iterable of turns (sequences of token counts), "
                         f"got {type(turns).__name__}")
    out, seen = [], set()
    for i, turn in enumerate(turns):
        if isinstance(turn, (str, bytes, dict)) or not hasattr(turn, "__iter__"):
            raise ValueError(f"turns[{i}]: expected a sequence of token counts, got {turn!r}")
        counts = tuple(turn)
        if not counts:
            raise ValueError(f"turns[{i}]: expected at least one unit (the final one), got none")
        for c in counts:
            if (isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer))
                    or not 0 <= c <= fh.CHUNK_TOKENS + 1):
                raise ValueError(f"turns[{i}]: expected token counts in [0, {fh.CHUNK_TOKENS + 1}], got {c!r}")
        counts = tuple(int(c) for c in counts)
        body, cut = counts[:-1], []
        for c in body:
            run = 0
            for prev in reversed(cut):
                if prev != c:
                    break
                run += 1
            if run < steady:
                cut.append(c)
        shape = tuple(cut) + counts[-1:]
        if shape not in seen:
            seen.add(shape)
            out.append(shape)
    return out


STEADY_UNITS = 4      # equal full units after which no new signature appears (rehearsal_turns)
PREPARE_TURNS = 2     # synthetic turns run at session open on CUDA (prepare)
PREPARE_UNITS = 5     # full units per synthetic turn: first, ramp and steady shapes recur by the 4th
PREPARE_SEED = 20261130


class CadenceSession:
    """One duplex session on DuplexCadence: arena state, in-place trims, exact-shape graph replay.

    t2w: the stock Token2wav instance (shared with any stock session: same weights and noise tables).
    graphs: None = on CUDA only; strict: an uncaptured signature after close() raises SignatureError.
    Raises InputError for bad input and ClockError for a step past a declared bound, both before any
    state changes.
    """

    #: What start_turn does to the state (duplex_session.turn_state): restores the voice's base state.
    turn_state = "reset"

    def __init__(self, t2w, prompt: fh.Prompt, *, graphs: bool | None = None, strict: bool = False,
                 arena_backend: str = "auto", vocoder: str = "cadence", noise: str = "host",
                 prepare_turns: int | None = None):
        if vocoder not in ("cadence", "stock"):
            raise ValueError(f"vocoder: expected 'cadence' (arena + graphs) or 'stock' (eager BoundedVocoder), "
                             f"got {vocoder!r}")
        if noise not in ("host", "device"):
            raise ValueError(f"noise: expected one of ('host', 'device'), got {noise!r}")
        if prepare_turns is not None and (isinstance(prepare_turns, bool) or not isinstance(prepare_turns, int)
                                          or prepare_turns < 0):
            raise ValueError(f"prepare_turns: expected None or an int >= 0, got {prepare_turns!r}")
        self.closed = False
        self.t2w = t2w
        self.prompt = prompt
        self.device = torch.device(t2w.device)
        self.n_steps = t2w.n_timesteps
        fh.install_prompt(t2w, prompt)
        self.P = prompt.mel_frames
        self.specs = {r.name: r for r in fh.regions(self.P)}
        Lmax = self.specs["estimator_att"].policy.bound()
        self.Lmax = Lmax
        flow = t2w.flow
        dit = flow.decoder.estimator
        self.n_token_layers, n_layers, depth, heads, dk2, dtype = flow_layout(flow)
        self.dtype = dtype


        self.arena = Arena(self.device, backend=arena_backend, name="flow_hift")
        a = self.arena
        a.declare("conformer_att", (n_layers, 1, heads, Lmax, dk2), dtype)
        a.declare("estimator_att", (self.n_steps, depth, 2, heads, Lmax, dk2), dtype)
        a.declare("estimator_cnn", (self.n_steps, depth, 2, 1024, 2), dtype)
        a.declare("conformer_cnn", (1, 512, 6), dtype)
        a.declare("dit_att_scratch", (depth, 2, heads, Lmax, dk2), dtype)
        a.declare("dit_cnn_scratch", (depth, 2, 1024, 2), dtype)
        # The flow step's mel output lives in the arena, not in the graph pool: the vocoder reads it block
        # by block while its own graphs replay, and a graph-pool output of one graph may share memory with
        # another graph's intermediates (graphs of one pool are safe only when each output is consumed
        # before the next replay).
        self._mel_channels = t2w.hift.conv_pre.in_channels
        a.declare("flow_mel", (1, self._mel_channels, 2 * fh.MAX_CALL_TOKENS), dtype)
        self.vocoder = ArenaVocoder(t2w, noise=noise) if vocoder == "cadence" else None
        if self.vocoder is not None:
            self.vocoder.declare(a)
        a.allocate()
        self._est_buf = a["estimator_att"].view((self.n_steps, depth, 2, heads, Lmax, dk2))
        self._est_cnn = a["estimator_cnn"].view((self.n_steps, depth, 2, 1024, 2))
        self._conf_cnn = a["conformer_cnn"].view((1, 512, 6))
        self._dit_att = a["dit_att_scratch"].view((depth, 2, heads, Lmax, dk2))
        self._dit_cnn = a["dit_cnn_scratch"].view((depth, 2, 1024, 2))
        self._shape_conf = (n_layers, 1, heads)
        # warmup=1: a signature's first occurrence in this process runs eagerly (lazy initialisations
        # outside capture); eager runs and captures hold the model's lock (sessions on host threads).
        self.graphs = GraphCache(self.device, enabled=graphs, strict=strict, arena=a, warmup=1,
                                 warmed=warmed_signatures(t2w, (self.n_steps, vocoder, noise)),
                                 lock=model_lock(t2w))
        self._own_vocoder = vocoder == "cadence"
        if self.vocoder is not None:
            self.vocoder.attach(a, self.graphs)
        self._timestep = _DeviceTimestepTable()
        self._timestep(torch.zeros(2, device=self.device, dtype=dtype), dit.t_embedder.frequency_embedding_size)
        # Per-voice base caches: the stock set-up, run once per voice and model (as MiniCPM-o does per
        # voice) and shared, read-only, by every cadence session of that voice: only the Euler steps in use.
        # It runs on this session's arena views (`_bound`), so the stock 16-step module buffers are not
        # needed (release_stock_buffers).
        with self._bound():
            self._base_flow, self._base_hift = voice_base(t2w, prompt, self.n_steps)
        self._tokens: dict[int, torch.Tensor] = {}
        self.len_conf = self.len_est = None   # host clocks (mel frames); None: no open turn
        self.buffer: list[int] | None = None
        self._hift: dict = {}
        self.turn = -1
        if prepare_turns is None:
            prepare_turns = PREPARE_TURNS if self.graphs.enabled else 0
        self.prepared = self.prepare(prepare_turns) if prepare_turns else None

    @property
    def concurrent(self) -> bool:
        """True when this session may run on its own host thread beside other sessions of this model:
        everything that touches shared module state runs under the model lock, and no capture can start
        any more (graphs frozen by `rehearse(freeze=True)`, or off). The stock vocoder path swaps
        t2w.hift_cache_dict per call, so it never is."""
        return self._own_vocoder and (self.graphs.closed or not self.graphs.enabled)

    # --- ahead-of-time capture ---------------------------------------------------------------------
    def prepare(self, turns: int = 2, units: int = PREPARE_UNITS) -> dict:
        """Capture this voice's turn-start, ramp and steady graphs before the first real turn.

        Runs `turns` synthetic turns of `units` full units (25 token ids each, from a fixed seeded
        sequence; turns are not flushed). A signature is captured on its second occurrence (GraphCache
        warmup=1), so two turns capture the turn-start shapes too; rare final-flush shapes are captured
        on first use later. Nothing of it reaches a real turn: start_turn() restores every region from the
        voice's base caches and resets the vocoder. Returns the graph counters' change.
        Raises ValueError for turns < 0 or units < 1 and InputError while a turn is open or after close(),
        before any state changes."""
        if (isinstance(turns, bool) or not isinstance(turns, int) or turns < 0 or isinstance(units, bool)
                or not isinstance(units, int) or units < 1):
            raise ValueError(f"prepare: expected turns >= 0 and units >= 1, got turns={turns!r}, units={units!r}")
        self._check_idle("prepare")
        gen = torch.Generator().manual_seed(PREPARE_SEED)
        return self._synthetic([(fh.CHUNK_TOKENS,) * units] * turns, flush=False, gen=gen)

    def rehearse(self, turns, *, freeze: bool = False, passes: int = 2) -> dict:
        """Capture every graph the given turns will need, before the live cadence.

        turns: an iterable of turns, each a sequence of token counts per SPEAK unit, the last one the
        final (flushed) unit, e.g. the session script's turns; `rehearsal_turns` reduces them to the
        distinct shortest shapes. Each shape runs as a synthetic turn (token ids from a fixed seeded
        sequence: shapes depend on counts only); a pass that still ran warm-up (first-occurrence eager)
        runs are followed by another, up to `passes`. freeze: then close the graph set (a later new
        signature runs eagerly and is counted as an eager fallback, or raises with strict=True), so no
        capture happens while sessions run on several host threads. Nothing of it reaches a real turn
        (start_turn restores the voice state). Returns the graph counters' change and the shapes run.
        Raises ValueError for bad turns, passes or freeze (before anything runs) and InputError while a turn
        is open or after close()."""
        shapes = rehearsal_turns(turns)
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"passes: expected an int >= 1, got {passes!r}")
        if not isinstance(freeze, (bool, np.bool_)):   # "no" would close the graph set
            raise ValueError(f"freeze: expected a bool, got {freeze!r} ({type(freeze).__name__})")
        self._check_idle("rehearse")
        gen = torch.Generator().manual_seed(PREPARE_SEED)
        total = None
        for _ in range(passes):
            delta = self._synthetic(shapes, flush=True, gen=gen)
            total = delta if total is None else {k: total[k] + delta[k] for k in delta}
            if not delta["warmup_runs"]:
                break
        if freeze:
            self.graphs.close()
        total["shapes"] = [list(t) for t in shapes]
        total["frozen"] = self.graphs.closed
        return total

    def _synthetic(self, turns, *, flush: bool, gen: torch.Generator) -> dict:
        """Run synthetic turns (token counts per unit; the last unit of each turn final if `flush`), then
        leave the session with no open turn. Returns the graph counters' change."""
        before = self.graphs.stats.snapshot()
        for counts in turns:
            self.start_turn()
            for k, n in enumerate(counts):
                final = flush and k == len(counts) - 1
                self.speak(torch.randint(0, fh.VOCAB_SIZE, (n,), generator=gen).tolist(), final=final)
        self.len_conf = self.len_est = None
        self.buffer = None
        self.turn = -1
        after = self.graphs.stats.snapshot()
        return {k: after[k] - before[k] for k in ("captures", "replays", "eager_runs", "warmup_runs",
                                                  "eager_fallbacks", "capture_failures")}

    # --- arena views ---------------------------------------------------------------------------
    def conformer_view(self, L: int) -> torch.Tensor:
        """The conformer KV cache as stock holds it: contiguous [layers, 1, heads, L, 128]."""
        return self.arena["conformer_att"].view(self._shape_conf + (L, 128))

    def estimator_view(self, L: int) -> torch.Tensor:
        """The DiT KV cache of the steps in use: [steps, depth, 2, heads, L, 128] (a slice of the buffer)."""
        return self._est_buf[:, :, :, :, :L, :]

    def state_tensors(self) -> dict:
        """Every region's logical contents now (views; clone to keep)."""
        return {"conformer_att": self.conformer_view(self.len_conf),
                "estimator_att": self.estimator_view(self.len_est),
                "estimator_cnn": self._est_cnn, "conformer_cnn": self._conf_cnn}

    # --- turn and unit ---------------------------------------------------------------------------
    def _check_open(self, what: str) -> None:
        if self.closed:
            raise InputError(f"{what}: the session is closed")

    def _check_idle(self, what: str) -> None:
        """InputError after close() or while a turn is open (synthetic turns would discard it)."""
        self._check_open(what)
        if self.buffer is not None:
            raise InputError(f"{what}: a turn is open ({what} would discard it); call it before start_turn "
                             "or after the turn's final unit")

    def start_turn(self) -> None:
        """Restore the voice's base caches into the arena (in place) and the [4218]*3 token buffer.
        Raises InputError on a closed session."""
        self._check_open("start_turn")
        P = self.P
        with torch.inference_mode():
            self.conformer_view(P).copy_(self._base_flow["conformer_att_cache"])
            self.estimator_view(P).copy_(self._base_flow["estimator_att_cache"][: self.n_steps])
            self._est_cnn.copy_(self._base_flow["estimator_cnn_cache"][: self.n_steps])
            self._conf_cnn.copy_(self._base_flow["conformer_cnn_cache"])
        self.len_conf = self.len_est = P
        self._hift = fh.clone_recursive(self._base_hift)   # vocoder state (stock BoundedVocoder cache dict)
        if self.vocoder is not None:
            self.vocoder.reset()                             # the same state, in the arena
        self.buffer = [fh.SILENCE_TOKEN] * fh.PRE_LOOKAHEAD
        self.turn += 1

    def speak(self, tokens, *, final: bool = False) -> UnitOutput:
        """One SPEAK unit (<= 26 token ids @ 25 Hz) -> float32 waveform @ 24 kHz, as StockSession.speak."""
        self._check_open("speak")
        if self.buffer is None:
            raise InputError("speak: no open turn (call start_turn first; a finalised turn is closed)")
        final = fh.check_final(final)
        tokens = fh.check_tokens(tokens)
        if len(tokens) > fh.CHUNK_TOKENS + 1:
            raise InputError(f"tokens: at most {fh.CHUNK_TOKENS + 1} per unit, got {len(tokens)}")
        calls, rest = fh.plan_calls(self.buffer, tokens, final)
        self._check_bounds(calls)
        waves = [self._call(c.tokens, c.last_chunk) for c in calls]
        self.buffer = None if final else rest
        wave = np.concatenate([w.reshape(-1) for w in waves]) if waves else np.zeros(0, np.float32)
        return UnitOutput(wave.astype(np.float32, copy=False), fh.to_pcm16(wave),
                          {"calls": [len(c.tokens) for c in calls]})

    def close(self) -> None:
        """Drop the session's graphs and give its arena back (the shared model and voice base stay).
        The session cannot be used afterwards (start_turn, speak, prepare raise InputError); a second
        close() does nothing."""
        if self.closed:
            return
        self.closed = True
        self.graphs.close()
        self.graphs.entries.clear()
        self.vocoder = None
        self.buffer = None
        self.arena.close()

    def stats(self) -> dict:
        out = self.graphs.stats.snapshot()
        out["prepared"] = self.prepared
        out.update(arena_backend=self.arena.backend, arena_fallback=self.arena.fallback,
                   arena_bytes_reserved=self.arena.bytes_reserved, arena_bytes_mapped=self.arena.bytes_mapped,
                   graph_pool_bytes=self.graphs.pool_bytes, graphs=len(self.graphs.entries))
        return out

    def _check_bounds(self, calls) -> None:
        Lc, Le = self.len_conf, self.len_est
        for c in calls:
            adv = fh.mel_advance(len(c.tokens), c.last_chunk)
            _, Lc = self.specs["conformer_att"].step(Lc, adv)
            _, Le = self.specs["estimator_att"].step(Le, adv)

    # --- one Token2wav.stream call ---------------------------------------------------------------
    def _call(self, tokens: list[int], last_chunk: bool) -> np.ndarray:
        n = len(tokens)
        if n:
            tok = self._tokens.get(n)
            if tok is None:
                tok = self._tokens[n] = torch.zeros((1, n), dtype=torch.int32, device=self.device)
            tok.copy_(torch.tensor([tokens], dtype=torch.int32))
            Lc, Le = self.len_conf, self.len_est
            sig = ("flow", n, bool(last_chunk), Lc, Le)
            mel = self.graphs.run(sig, lambda: self._flow_step(tok, last_chunk, Lc, Le))
            adv = fh.mel_advance(n, last_chunk)
            self.len_conf = self.specs["conformer_att"].step(Lc, adv)[1]
            self.len_est = self.specs["estimator_att"].step(Le, adv)[1]
        else:  # an empty final call only flushes the vocoder (token2wav.py L271-273)
            mel = self._hift["mel"][:, :, :0]
        with torch.inference_mode():
            if self.vocoder is not None:
                speech = self.vocoder.stream_vocode(mel, last_chunk)
            else:
                self.t2w.hift_cache_dict = self._hift        # several sessions may share one Token2wav
                speech = self.t2w._stream_vocode(mel, last_chunk)
        return speech.cpu().numpy()

    @contextmanager
    def _bound(self):
        """Point the stock CFM/DiT module buffers at this session's arena for one step."""
        cfm = self.t2w.flow.decoder
        dit = cfm.estimator
        saved = (cfm._buffers["att_cache_buffer"], cfm._buffers["cnn_cache_buffer"],
                 dit._buffers["att_cache_buffer"], dit._buffers["cnn_cache_buffer"])
        cfm._buffers["att_cache_buffer"], cfm._buffers["cnn_cache_buffer"] = self._est_buf, self._est_cnn
        dit._buffers["att_cache_buffer"], dit._buffers["cnn_cache_buffer"] = self._dit_att, self._dit_cnn
        dit.t_embedder.timestep_embedding = self._timestep
        try:
            yield
        finally:
            (cfm._buffers["att_cache_buffer"], cfm._buffers["cnn_cache_buffer"],
             dit._buffers["att_cache_buffer"], dit._buffers["cnn_cache_buffer"]) = saved
            del dit.t_embedder.timestep_embedding

    def _flow_step(self, tok: torch.Tensor, last_chunk: bool, Lc: int, Le: int) -> torch.Tensor:
        """flow.inference_chunk on arena views, then the stock trims as in-place arena shifts.
        Reads and writes only arena views and `tok`; changes no host state (graph-capturable)."""
        t2w = self.t2w
        _, _, spk, _, _ = t2w.cache[self.prompt.key]
        cache = {"conformer_cnn_cache": self._conf_cnn, "conformer_att_cache": self.conformer_view(Lc),
                 "estimator_cnn_cache": self._est_cnn, "estimator_att_cache": self.estimator_view(Le)}
        with torch.inference_mode(), self._bound():
            with torch.amp.autocast("cuda", dtype=torch.float16, enabled=t2w.float16):
                mel, new = t2w.flow.inference_chunk(token=tok, spk=spk, cache=cache, last_chunk=last_chunk,
                                                    n_timesteps=self.n_steps)
            self._keep_conformer(new["conformer_att_cache"])
            self._conf_cnn.copy_(new["conformer_cnn_cache"])
            self._keep_estimator(new["estimator_att_cache"].shape[4])
            out = self.arena["flow_mel"].view(tuple(mel.shape))
            out.copy_(mel)
        return out

    def _keep_conformer(self, new: torch.Tensor) -> None:
        """Write the grown conformer cache (a fresh tensor from the encoder) into the arena, trimmed as
        Token2wav._trim_conformer_cache (L228-247): prompt + last 100 mel frames; token-rate layers
        trimmed at token rate (P/2 + last 50) and repacked as [cache, cache]."""
        L = new.shape[3]
        P, tail, d = self.P, fh.TAIL_FRAMES, self.n_token_layers
        if L <= P + tail:
            self.conformer_view(L).copy_(new)
            return
        out = self.conformer_view(P + tail)
        half, lhalf = (P + tail) // 2, L // 2
        out[:d, :, :, : P // 2].copy_(new[:d, :, :, : P // 2])
        out[:d, :, :, P // 2: half].copy_(new[:d, :, :, lhalf - tail // 2: lhalf])
        out[:d, :, :, half:].copy_(out[:d, :, :, :half])
        out[d:, :, :, :P].copy_(new[d:, :, :, :P])
        out[d:, :, :, P:].copy_(new[d:, :, :, L - tail:])

    def _keep_estimator(self, L: int) -> None:
        """Token2wav._trim_estimator_cache (L220-226) in place: once L > P + 100 keep [:P] (the newest
        P frames: keys are newest-first) and move the last 100 frames to [P, P+100), in pieces no longer
        than the shift so that no piece reads what an earlier piece wrote."""
        P, tail = self.P, fh.TAIL_FRAMES
        if L <= P + tail:
            return
        shift = L - (P + tail)
        buf = self._est_buf
        for i in range(0, tail, shift):
            w = min(shift, tail - i)
            buf[:, :, :, :, P + i: P + i + w].copy_(buf[:, :, :, :, P + shift + i: P + shift + i + w])
