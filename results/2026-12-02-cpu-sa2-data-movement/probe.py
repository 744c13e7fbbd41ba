"""Where the data-movement ops of one steady Step-Audio 2 SPEAK unit come from, per Python call site (CPU).

    cd /work/main && PYTHONPATH=impl:. TORCHDYNAMO_DISABLE=1 .venv/bin/python \
        results/2026-12-02-cpu-sa2-data-movement/probe.py [--modes stock,cadence] [--depth released|reduced] \
        [--warm 3] [--skip 2] [--out results/2026-12-02-cpu-sa2-data-movement/probe.json]

For each mode (stock first, then cadence; a fresh model per mode, built as suite.measure.floor builds it:
`adapter.build_model(spec, device="cpu", depth=..., seed=weights seed)`, then `adapter.for_mode`), it opens one
session, `prepare(None)`s it and walks the workload's session script as floor.Walk does: the first --warm SPEAK
units (3: script units 3, 4, 6), then --skip steady SPEAK units (2: units 7, 8; floor's timed units), then
profiles the next steady SPEAK unit (unit 9, the first unit floor profiled on the H200) with torch.profiler (CPU
activity, record_shapes=True). Everything runs eagerly on the CPU (no CUDA graphs), so the aten ops are those the
GPU run launches eagerly or records into its DiT / HiFT graphs.

Call sites. torch 2.13's with_stack=True only gives Python *function* events (the def line, not the calling
line), so the probe pushes a TorchFunctionMode (`Sites`) for the profiled unit: every torch API call made from
Python (torch.*, Tensor methods, F.*, __setitem__) is wrapped in a profiler range `call#N`, and call N's Python
stack (file, line, function for every frame) is kept. Nested torch API calls inside a wrapped call are not
wrapped again (a mode is off inside its own handler), so a range is always the outermost torch call on its line.

Data-movement ops. An aten op named in MOVEMENT (cat, copy_, index_put_/index_copy_, index/index_select,
gather/scatter, reflection/replication pad, roll, flip) that has no MOVEMENT op above it in the aten tree is one
"movement op" (one kernel on CUDA, as suite/measure/kernels.py's DATA_MOVEMENT_KERNELS classes them: the kind is
taken from the op chain, e.g. roll > cat counts as roll_flip, contiguous > clone > copy_ as copy). Its site is
the innermost frame in the upstream package (site-packages/stepaudio2, minicpmo: "upstream") and, separately, the
innermost frame in impl/duplexcadence ("impl": the runtime line outside that upstream frame). `issued_by` says which
of the two is innermost: runtime code that upstream calls back (cadence's routed DiT inputs, its timestep table)
counts as "impl", with the impl site its own line. `via` is the aten chain from the wrapped torch call down to it.

Classification: REVIEWED holds the sites read by hand (class, what it is, and where CUDA differs); other sites get
a heuristic from the source line and op chain (`heuristic_class` keeps it for all):
  a  cache append: torch.cat of a cache and new frames (conv / KV caches, the HiFT mel concat)
  b  layout copy: .contiguous(), transpose/permute/reshape followed by a copy, dtype casts (.to(dtype)/.float())
  c  copy into preallocated state the runtime already does (copy_ into arena / static buffers from impl/)
  d  other (padding, building inputs, stack/cat of non-cache tensors, ops inside compute kernels)

CUDA. Each site carries `cuda`: "kernel" (a data-movement kernel on CUDA, as floor counts them), "memcpy"
(contiguous into contiguous of one dtype: copy_ takes cudaMemcpyAsync, no kernel; inside the DiT / HiFT graphs floor
counts none), "view" (no op on CUDA), or "none (cpu-only | cpu-likely)" (on_cuda: an operand's dtype-promotion
temporary, a wrapped Python scalar, the CPU conv paths, addmm's bias copy, repeat's internal cat).
`cuda_kernels_estimate` sums the "kernel" sites per kind; `mbytes_moved` is read + write, float32, approximate.

Writes --out (JSON: per mode the unit's wall time, totals by kind, every site with counts, shapes, via chains and
source text; about 90 s at the released depth on 2 cores) and prints the top sites. table.md beside it is the
reviewed summary of that output. Exit status 0, or an exception.
"""
from __future__ import annotations

import argparse
import collections
import json
import linecache
import math
import os
import sys
import time
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

import duplexcadence
import workloads
from duplexcadence import runtime, upstream
from suite.measure.session import make_spec, payload_of, select_units

WORKLOAD = "stepaudio2_mini"
UPSTREAM_DIRS = (os.path.dirname(os.path.abspath(upstream.stepaudio2().__file__)) + os.sep,)   # .../stepaudio2/
SITE_PACKAGES = os.path.dirname(UPSTREAM_DIRS[0].rstrip(os.sep)) + os.sep
UPSTREAM_DIRS += (os.path.join(SITE_PACKAGES, "minicpmo") + os.sep,)
IMPL_DIR = os.path.dirname(os.path.abspath(duplexcadence.__file__)) + os.sep
REPO = Path(__file__).resolve().parents[2]
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep

MOVEMENT = {"aten::cat", "aten::copy_", "aten::index_put_", "aten::_index_put_impl_", "aten::index_copy_",
            "aten::index", "aten::index_select", "aten::gather", "aten::scatter", "aten::scatter_",
            "aten::reflection_pad1d", "aten::reflection_pad2d", "aten::replication_pad1d",
            "aten::replication_pad2d", "aten::roll", "aten::flip"}
# torch API calls that never launch an aten op worth a range (attribute reads); skipped for speed
QUIET = {"__get__", "size", "dim", "numel", "stride", "is_contiguous", "data_ptr", "element_size", "__len__",
         "is_floating_point", "storage_offset", "is_complex", "get_device", "__hash__", "__eq__", "__format__",
         "__repr__", "__bool__", "__index__", "__int__", "__float__", "_is_view", "type", "has_names"}
# compute ops on CPU whose internal copies may differ on CUDA (kernels that take strided inputs there)
COMPUTE = ("conv", "linear", "matmul", "bmm", "mm", "addmm", "baddbmm", "scaled_dot_product", "stft", "istft",
           "lstm", "layer_norm", "group_norm", "einsum", "_fft")


# Reviewed sites (minicpmo-utils 1.0.7's stepaudio2 package; impl/ at the commit this ran on): (file suffix, line) ->
# (class, what it is, CUDA override or None). CUDA override: "memcpy" (contiguous into contiguous, one dtype: a
# cudaMemcpyAsync, no kernel, and inside a CUDA graph not in floor's counts), "view" (no op on CUDA). Unlisted
# sites keep the heuristic class (guess_class) and the on_cuda flag.
REVIEWED = {
    ("flow/decoder_dit.py", 233): ("a", "CausalConv1d.forward_chunk: cat(conv cache [2 frames], new frames) before "
                                       "each causal conv (2 per CausalConvBlock)", None),
    ("flow/decoder_dit.py", 142): ("a", "Attention.forward_chunk: K = cat(new k, k cache) (new frames FIRST)", None),
    ("flow/decoder_dit.py", 143): ("a", "Attention.forward_chunk: V = cat(new v, v cache) (new frames FIRST)", None),
    ("flow/decoder_dit.py", 146): ("a", "Attention.forward_chunk: new_att_cache = cat(K, V, dim=3): the grown KV "
                                       "packed into a fresh tensor", None),
    ("flow/decoder_dit.py", 291): ("a", "CausalConvBlock.forward_chunk: new conv cache = cat(cache1, cache2)", None),
    ("flow/decoder_dit.py", 581): ("a", "DiT.blocks_forward_chunk: layer's conv cache stored into cnn_cache_buffer[b] "
                                       "(cadence: arena dit_cnn_scratch)", "memcpy"),
    ("flow/decoder_dit.py", 582): ("a", "DiT.blocks_forward_chunk: layer's grown KV stored into "
                                       "att_cache_buffer[b][:, :, :L] (cadence: arena dit_att_scratch)", None),
    ("flow/decoder_dit.py", 130): ("b", "q_norm (LayerNorm over head_dim) on the transposed (b, nh, t, d) view: "
                                       "native_layer_norm makes it contiguous", None),
    ("flow/decoder_dit.py", 131): ("b", "k_norm, as q_norm", None),
    ("flow/decoder_dit.py", 288): ("b", "CausalConvBlock: Transpose -> LayerNorm on the transposed conv output "
                                       "(LayerNorm makes it contiguous)", None),
    ("flow/decoder_dit.py", 151): ("b", "SDPA output transpose(1,2).reshape: a copy on CPU; CUDA's SDPA returns "
                                       "(b, t, nh, d) memory, so a view there", "view"),
    ("flow/decoder_dit.py", 577): ("b", "DiT in_proj on x.transpose(1, 2): linear folds the non-contiguous 3-d input "
                                       "with a copy", None),
    ("flow/decoder_dit.py", 535): ("d", "pack([x, mu]): DiT input rebuilt every Euler step", None),
    ("flow/decoder_dit.py", 538): ("d", "pack([x, spks]) every step", None),
    ("flow/decoder_dit.py", 540): ("d", "pack([x, cond]) every step", None),
    ("flow/decoder_dit.py", 192): ("d", "timestep embedding cat(cos, sin)", None),
    ("adapters/flow_hift/flowstate.py", 43): ("d", "timestep embedding cat(cos, sin) (DeviceTimestepTable, cadence's "
                                                    "stand-in for decoder_dit.py L186-195)", None),
    ("flow/flow_matching.py", 150): ("d", "x.repeat(2, 1, 1): CFG batch every step", None),
    ("flow/flow_matching.py", 152): ("d", "t.repeat(2): CFG batch every step", None),
    ("flow/flow_matching.py", 140): ("d", "mu_in = cat(mu, zeros) (CFG), once per call", None),
    ("flow/flow_matching.py", 141): ("d", "spks_in = cat(spks, zeros), once per call", None),
    ("flow/flow_matching.py", 142): ("d", "cond_in = cat(cond, zeros), once per call", None),
    ("flow/flow_matching.py", 165): ("a", "CFM: step's conv caches stored into cnn_cache_buffer[step-1] "
                                          "(cadence: arena estimator_cnn)", "memcpy"),
    ("flow/flow_matching.py", 166): ("a", "CFM: step's KV (all layers) stored into att_cache_buffer[step-1][..., :L, :] "
                                          "(cadence: arena estimator_att)", None),
    ("transformer/attention.py", 297): ("a", "conformer RelPositionMultiHeadedAttention: cat(key_cache, k)", None),
    ("transformer/attention.py", 298): ("a", "conformer: cat(value_cache, v)", None),
    ("transformer/attention.py", 301): ("a", "conformer: new_cache = cat(k, v, -1)", None),
    ("transformer/attention.py", 239): ("d", "conformer rel_shift: cat(zero_pad, x)", None),
    ("transformer/attention.py", 123): ("b", "conformer: attention output transpose(1, 2).contiguous()", None),
    ("transformer/upsample_encoder_v2.py", 134): ("a", "PreLookaheadLayer: cat(conv cache, x)", None),
    ("transformer/upsample_encoder_v2.py", 80): ("a", "Upsample1D: cat(conv cache, x)", None),
    ("transformer/upsample_encoder_v2.py", 451): ("a", "stack the token-rate layers' new KV caches", None),
    ("transformer/upsample_encoder_v2.py", 472): ("a", "stack the up layers' new KV caches", None),
    ("transformer/upsample_encoder_v2.py", 478): ("a", "new conformer cache = cat(token-rate caches .repeat(..2..), "
                                                       "up caches): a fresh [10, 1, 8, L, 128] tensor every call", None),
    ("transformer/upsample_encoder_v2.py", 479): ("a", "new conformer conv cache = cat(cnn1, cnn2)", None),
    ("transformer/upsample_encoder_v2.py", 127): ("b", "transpose(1, 2).contiguous()", None),
    ("transformer/upsample_encoder_v2.py", 136): ("b", "transpose(1, 2).contiguous()", None),
    ("transformer/upsample_encoder_v2.py", 454): ("b", "transpose(1, 2).contiguous()", None),
    ("transformer/upsample_encoder_v2.py", 457): ("b", "transpose(1, 2).contiguous()", None),
    ("flow/flow.py", 212): ("b", "mu = h.transpose(1, 2).contiguous()", None),
    ("flow/flow.py", 214): ("b", "cond = cond.transpose(1, 2).contiguous()", None),
    ("flow/flow.py", 199): ("d", "token embedding (index_select)", None),
    ("modules/hifigan.py", 205): ("d", "HiFT: cat(stft real, imag)", None),
    ("modules/hifigan.py", 188): ("d", "HiFT stft centre padding (reflection)", None),
    ("modules/hifigan.py", 213): ("d", "HiFT reflection_pad", None),
    ("modules/hifigan.py", 210): ("d", "HiFT ups[i] conv_transpose1d: _convolution makes its input contiguous", None),
    ("modules/hifigan.py", 247): ("a", "HiFT: cached source written over the head of the new source", "memcpy"),
    ("hifigan_components/layers.py", 315): ("d", "SineGen: rand_ini[:, 0] = 0 (a fill on CUDA)", "view"),
    ("hifigan_components/layers.py", 316): ("d", "SineGen: rad_values[:, 0, :] += rand_ini", "memcpy"),
    ("adapters/flow_hift/flowstate.py", 129): ("c", "FlowState.keep: upstream's fresh conformer cache copied into the "
                                                     "arena region", None),
    ("adapters/flow_hift/flowstate.py", 137): ("c", "FlowState.keep: conformer conv cache into the arena", None),
    ("adapters/flow_hift/flowstate.py", 191): ("c", "token ids into the static int32 buffer (host-to-device on CUDA)",
                                               "memcpy"),
    ("duplexcadence/payload.py", 130): ("c", "move_tail_: the DiT trim cat(att[..., :P], att[..., -100:]) in place", None),
    ("adapters/flow_hift/cadence_sa2.py", 109): ("c", "routed DiT: mu into the static input", None),
    ("adapters/flow_hift/cadence_sa2.py", 110): ("c", "routed DiT: spks into the static input", None),
    ("adapters/flow_hift/cadence_sa2.py", 111): ("c", "routed DiT: cond into the static input", None),
    ("adapters/flow_hift/hift_graph.py", 98): ("c", "HiFT input mel: cached 8 frames into the static buffer", None),
    ("adapters/flow_hift/hift_graph.py", 99): ("c", "HiFT input mel: the new 50 frames into the static buffer", None),
    ("adapters/flow_hift/hift_graph.py", 108): ("c", "HiFT mel cache kept (arena)", None),
    ("adapters/flow_hift/hift_graph.py", 109): ("c", "HiFT source cache kept (arena)", None),
    ("adapters/flow_hift/hift_graph.py", 110): ("c", "HiFT speech cache kept (arena)", None),
    ("adapters/flow_hift/hift_graph.py", 130): ("c", "HiFT step: magnitude / phase into arena outputs", None),
    ("adapters/flow_hift/hift_graph.py", 132): ("c", "HiFT step: source tail into the arena output", None),
    ("adapters/flow_hift/build.py", 176): ("d", "fade_in_out: speech.clone() (t2w L14-22; both modes)", None),
    ("adapters/flow_hift/build.py", 177): ("d", "fade_in_out: cross-faded head written back (float64 -> float32)", None),
    ("adapters/flow_hift/build.py", 227): ("a", "stock driver: DiT trim cat(att[..., :P], att[..., -100:]) "
                                                "(t2w L137-141)", None),
    ("adapters/flow_hift/build.py", 230): ("a", "stock driver: HiFT mel = concat(cached mel, chunk mel) (t2w L143)", None),
    ("adapters/flow_hift/build.py", 234): ("a", "stock driver: HiFT mel cache clone (t2w L156-160)", None),
    ("adapters/flow_hift/build.py", 235): ("a", "stock driver: HiFT source cache clone", None),
    ("adapters/flow_hift/build.py", 236): ("a", "stock driver: HiFT speech cache clone", None),
}


def reviewed(site) -> tuple | None:
    if site is None:
        return None
    for (suffix, line), value in REVIEWED.items():
        if line == site[1] and site[0].endswith(suffix):
            return value
    return None


def kind_of(chain: list[str]) -> str:
    """suite/measure/kernels.py's DATA_MOVEMENT_KERNELS kind of a movement op, from its aten chain."""
    names = " ".join(chain)
    for kind, frags in (("roll_flip", ("aten::roll", "aten::flip")), ("pad", ("_pad1d", "_pad2d")),
                        ("index_put", ("index_put", "index_copy")), ("cat", ("aten::cat",)),
                        ("scatter_gather", ("aten::gather", "aten::scatter")),
                        ("index", ("aten::index", "aten::index_select"))):
        if any(f in names for f in frags):
            return kind
    return "copy"


def short(path: str) -> str:
    if path.startswith(IMPL_DIR):
        return "impl/duplexcadence/" + path[len(IMPL_DIR):]
    if path.startswith(SITE_PACKAGES):
        return path[len(SITE_PACKAGES):]
    if path.startswith(str(REPO) + os.sep):
        return path[len(str(REPO)) + 1:]
    if path.startswith(TORCH_DIR):
        return "torch/" + path[len(TORCH_DIR):]
    return path


def shapes_of(args, kwargs) -> str:
    out = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append("x".join(map(str, a.shape)) + ("" if a.is_contiguous() else "(nc)"))
        elif isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a):
            out.append("[" + ",".join("x".join(map(str, t.shape)) for t in a) + "]")
    return " ".join(out)


class Sites(TorchFunctionMode):
    """Wraps every torch API call made from Python in a profiler range `call#N` and keeps call N's stack."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []          # (func name, arg shapes, stack key)
        self.stacks: dict[tuple, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in QUIET:
            return func(*args, **kwargs)
        frames, f = [], sys._getframe(1)
        while f is not None and len(frames) < 60:
            frames.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
            f = f.f_back
        key = tuple(frames)
        sid = self.stacks.setdefault(key, len(self.stacks))
        qual = getattr(func, "__qualname__", name)
        mod = getattr(func, "__module__", None) or ""
        listed = next((a for a in args if isinstance(a, (list, tuple)) and a
                       and all(isinstance(t, torch.Tensor) for t in a)), None)
        numel = sum(t.numel() * t.element_size() for t in listed) if listed is not None else None
        memcpy = None         # a direct copy_ / clone: contiguous into contiguous, one dtype (a memcpy on CUDA)
        if name == "copy_" and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            memcpy = bool(args[0].is_contiguous() and args[1].is_contiguous() and args[0].dtype == args[1].dtype)
        elif name == "clone" and args and isinstance(args[0], torch.Tensor):
            memcpy = bool(args[0].is_contiguous())
        self.calls.append((f"{mod}.{qual}" if mod and not qual.startswith("Tensor") else qual,
                           shapes_of(args, kwargs), sid, memcpy, numel))
        with torch._C._profiler._RecordFunctionFast(f"call#{len(self.calls) - 1}"):
            return func(*args, **kwargs)


def innermost(frames, dirs, after=None) -> tuple | None:
    """The innermost frame under `dirs` (a TorchFunctionMode handler's frame skipped); with `after` (an upstream
    frame), the innermost one outside it (the runtime line that called into upstream)."""
    seen = after is None
    for path, line, fn in frames:
        if not seen:
            seen = short(path) == after[0] and line == after[1]
            continue
        if path.startswith(dirs) and fn != "__torch_function__":
            return (short(path), line, fn, linecache.getline(path, line).strip())
    return None


def on_cuda(chain: list[str], leaf_shapes) -> str:
    """Whether the CUDA run launches this movement op too: "cpu-only" for a wrapped Python scalar's dtype copy
    (a kernel argument on CUDA), an operand's dtype-promotion temporary inside a binary op (CUDA casts inside the
    kernel) and the CPU convolution paths; "cpu-likely" for addmm's bias copy into its output (CUDA's linear on a
    1-d contiguous bias takes the cuBLASLt bias epilogue, no copy) and repeat's internal cat (CUDA's repeat is one
    expand + copy_); "both" otherwise. "both" copies of contiguous into contiguous tensors of one dtype are a
    cudaMemcpyAsync on CUDA, not a kernel (see `memcpy_hint`)."""
    names = " > ".join(chain)
    if chain[-1] == "aten::copy_" and leaf_shapes and all(s == [] for s in leaf_shapes[:2]):
        return "cpu-only"
    if any(x in names for x in ("slow_conv", "thnn_conv", "mkldnn", "_nnpack")):
        return "cpu-only"
    if len(chain) >= 4 and chain[-3:] == ["aten::to", "aten::_to_copy", "aten::copy_"] and chain[-4] != "aten::to":
        return "cpu-only"           # an operand's type-promotion temporary (CPU TensorIterator; CUDA casts in-kernel)
    if "aten::addmm > aten::copy_" in names or "aten::repeat > aten::cat" in names:
        return "cpu-likely"
    return "both"


def guess_class(kind: str, chain: list[str], func: str, up, impl) -> str:
    text = ((up or impl or ("", 0, "", ""))[3] or "").lower()
    itext = ((impl or ("", 0, "", ""))[3] or "").lower()
    outer = chain[0] if chain else ""
    if any(c in outer for c in COMPUTE) and outer not in ("aten::copy_",):
        return "d"           # a copy made inside a compute op (CPU implementation detail, maybe not on CUDA)
    if kind == "cat" and ("cache" in text or "cache" in itext or "hift_cache" in text or "concat" in text):
        return "a"
    if up is None and impl is not None and kind == "copy" and "copy_(" in itext:
        return "c"
    if kind == "copy" and (".contiguous" in text or "transpose" in text or "permute" in text or ".to(" in text
                           or ".float(" in text or "reshape" in text or "rearrange" in text
                           or any(x in " ".join(chain) for x in ("aten::contiguous", "aten::_to_copy",
                                                                  "aten::reshape", "aten::_reshape_alias"))):
        return "b"
    return "d"


def analyse(prof, sites: Sites) -> dict:
    sites_frames = {v: k for k, v in sites.stacks.items()}
    events = prof.events()
    rows = collections.Counter()
    info: dict = {}
    totals = collections.Counter()
    unattributed = collections.Counter()
    totals_gpu = collections.Counter()
    nbytes = collections.Counter()
    for ev in events:
        if ev.name not in MOVEMENT:
            continue
        chain, call, p = [ev.name], None, ev.cpu_parent
        root = True
        while p is not None:
            if p.name.startswith("call#"):
                call = int(p.name[5:])
                break
            if p.name in MOVEMENT:
                root = False
                break
            chain.insert(0, p.name)
            p = p.cpu_parent
        if not root:
            continue
        kind = kind_of(chain)
        totals[kind] += 1
        if call is None:
            unattributed[" > ".join(chain)] += 1
            totals_gpu[(kind, on_cuda(chain, ev.input_shapes))] += 1
            continue
        func, shp, sid, memcpy, list_bytes = sites.calls[call]
        frames = sites_frames[sid]
        up = innermost(frames, UPSTREAM_DIRS)
        impl = innermost(frames, (IMPL_DIR,), after=up)
        issuer = innermost(frames, UPSTREAM_DIRS + (IMPL_DIR,))
        by = "upstream" if issuer is not None and issuer[:2] == (up or ())[:2] else "impl"
        if by == "impl":
            impl = issuer
        gpu = on_cuda(chain, ev.input_shapes)
        totals_gpu[(kind, gpu)] += 1
        key = (by, up[:2] if up else None, impl[:2] if impl else None, kind, func, gpu)
        rows[key] += 1
        shapes = ev.input_shapes or []
        if chain[-1] == "aten::copy_" and len(shapes) >= 2 and shapes[1]:
            moved = 2 * 4 * math.prod(shapes[1])            # read + write, float32 (every tensor here is)
        elif kind == "cat" and list_bytes:
            moved = 2 * list_bytes
        else:
            moved = 2 * 4 * math.prod(shapes[0]) if shapes and shapes[0] else 0
        nbytes[key] += moved
        d = info.setdefault(key, {"upstream": up, "impl": impl, "kind": kind, "func": func, "on_cuda": gpu, "by": by,
                                  "via": collections.Counter(), "shapes": collections.Counter(),
                                  "op_shapes": collections.Counter(), "memcpy": collections.Counter(),
                                  "class": guess_class(kind, chain, func, up, impl),
                                  "stack": [f"{short(a)}:{b} {c}" for a, b, c in frames
                                            if not a.startswith(TORCH_DIR)][:8]})
        d["via"][" > ".join(chain)] += 1
        d["shapes"][shp] += 1
        d["memcpy"][memcpy] += 1
        d["op_shapes"][str(ev.input_shapes)[:160]] += 1
    out, cuda = [], collections.Counter()
    for key, n in rows.most_common():
        d = info[key]
        site = d["upstream"] if d["by"] == "upstream" else d["impl"]
        rev = reviewed(site)
        cls, what, override = rev if rev is not None else (d["class"], None, None)
        if d["on_cuda"] != "both":
            on = "none (" + d["on_cuda"] + ")"
        elif override is not None:
            on = override
        else:
            on = "memcpy" if d["memcpy"].most_common(1)[0][0] else "kernel"
        if on == "kernel":
            cuda[d["kind"]] += n
        out.append({"count": n, "cuda": on, "class": cls, "what": what, "reviewed": rev is not None,
                    "mbytes_moved": round(nbytes[key] / 1e6, 3), "issued_by": d["by"], "kind": d["kind"],
                    "heuristic_class": d["class"], "func": d["func"],
                    "on_cuda": d["on_cuda"], "memcpy_hint": d["memcpy"].most_common(1)[0][0],
                    "upstream": None if d["upstream"] is None else
                    {"file": d["upstream"][0], "line": d["upstream"][1], "function": d["upstream"][2],
                     "text": d["upstream"][3]},
                    "impl": None if d["impl"] is None else
                    {"file": d["impl"][0], "line": d["impl"][1], "function": d["impl"][2], "text": d["impl"][3]},
                    "via": dict(d["via"].most_common(4)), "shapes": dict(d["shapes"].most_common(4)),
                    "op_input_shapes": dict(d["op_shapes"].most_common(3)),
                    "stack": d["stack"]})
    on_gpu = {k: n for (k, g), n in totals_gpu.items() if g == "both"}
    return {"movement_ops": sum(totals.values()), "by_kind": dict(totals.most_common()),
            "movement_ops_also_on_cuda": sum(on_gpu.values()), "by_kind_also_on_cuda": on_gpu,
            "by_kind_and_on_cuda": {f"{k}/{g}": n for (k, g), n in sorted(totals_gpu.items())},
            "cuda_kernels_estimate": {"total": sum(cuda.values()), **dict(cuda.most_common())},
            "aten_ops": sum(1 for e in events if e.name.startswith("aten::") and
                            (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))),
            "unattributed": dict(unattributed.most_common(10)), "sites": out}


def run_mode(mode: str, depth: str, warm: int, skip: int) -> dict:
    wl = workloads.get(WORKLOAD)
    adapter = runtime.adapter(wl.architecture)
    spec = make_spec(wl)
    seed = (wl.seeds or {}).get("weights", 0)
    t0 = time.perf_counter()
    model = adapter.build_model(spec, device="cpu", depth=depth, seed=seed)
    dropped = adapter.for_mode(model, mode)
    build_s = time.perf_counter() - t0
    session = adapter.new_session(model, mode, spec)
    units_log, result = [], None
    try:
        session.prepare(None)
        open_turn, last_speak_turn, n_speak, steady_done = None, object(), 0, 0
        for unit in select_units(wl):
            if unit.kind != "SPEAK":
                continue
            payload, _, size = payload_of(unit)
            first = unit.turn != last_speak_turn
            if unit.turn != open_turn:
                session.start_turn()
                open_turn = unit.turn
            final = bool(unit.final)
            steady = not (first or final)
            profile_now = n_speak >= warm and steady and steady_done >= skip
            if profile_now:
                sites = Sites()
                t0 = time.perf_counter()
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                            record_shapes=True) as prof:
                    with sites:
                        out = session.speak(payload, final=final)
                wall = time.perf_counter() - t0
                result = analyse(prof, sites)
                result.update({"unit_index": int(unit.index), "tokens": size, "profiled_wall_s": round(wall, 2),
                               "torch_calls": len(sites.calls), "samples": int(out.samples)})
                units_log.append({"index": int(unit.index), "role": "profiled", "wall_s": round(wall, 2)})
                print(f"  {mode}: unit {unit.index} profiled {wall:.1f} s", flush=True)
                break
            t0 = time.perf_counter()
            out = session.speak(payload, final=final)
            wall = time.perf_counter() - t0
            role = "warm" if n_speak < warm else "steady-unprofiled"
            units_log.append({"index": int(unit.index), "role": role, "tokens": size, "final": final,
                              "wall_s": round(wall, 2), "samples": int(out.samples)})
            print(f"  {mode}: unit {unit.index} {role} {wall:.1f} s", flush=True)
            n_speak += 1
            if final:
                open_turn = None
            last_speak_turn = unit.turn
            if role != "warm" and steady:
                steady_done += 1
    finally:
        session.close()
    if result is None:
        raise RuntimeError("the script ran out before a steady unit was profiled")
    return {"mode": mode, "depth": depth, "build_s": round(build_s, 1), "for_mode": dropped,
            "units": units_log, **result}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="stock,cadence")
    ap.add_argument("--depth", choices=("released", "reduced"), default="released")
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).with_name("probe.json")))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from duplexcadence.adapters.flow_hift import facts
    record = {"workload": WORKLOAD, "depth": args.depth, "torch": torch.__version__,
              "layers": facts.RELEASED if args.depth == "released" else facts.REDUCED,
              "n_timesteps": make_spec(workloads.get(WORKLOAD)).get("n_timesteps"),
              "upstream_dirs": list(UPSTREAM_DIRS), "impl_dir": IMPL_DIR,
              "command": " ".join([sys.executable, *sys.argv]), "modes": {}}
    for mode in [m for m in args.modes.split(",") if m]:
        record["modes"][mode] = run_mode(mode, args.depth, args.warm, args.skip)
        Path(args.out).write_text(json.dumps(record, indent=1, default=str))
    for mode, r in record["modes"].items():
        print(f"\n== {mode}: unit {r['unit_index']} {r['profiled_wall_s']} s profiled; movement ops {r['movement_ops']} "
              f"{r['by_kind']}; CUDA kernels (estimate) {r['cuda_kernels_estimate']}; unattributed "
              f"{sum(r['unattributed'].values())}")
        for s in r["sites"][:40]:
            loc = s["upstream"] if s["issued_by"] == "upstream" else s["impl"]
            print(f"{s['count']:6d} {s['kind']:5s} {s['cuda'][:16]:16s} {s['class']} {loc['file']}:{loc['line']}  "
                  f"{loc['text'][:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
