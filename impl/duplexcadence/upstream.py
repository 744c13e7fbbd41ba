"""Import the stock (upstream) packages as they ship, without the parts no decode path uses.

`stepaudio2` (minicpmo-utils==1.0.7) imports `onnxruntime`, `s3tokenizer` and `torchaudio` at module
level in `stepaudio2/token2wav.py` (L9-13), but only prompt preparation (`Token2wav._prepare_prompt`,
L136-156: the S3 speech tokenizer and the CAMPPlus speaker model, both ONNX files that ship with the
weights) uses them. torchaudio has no build for the torch on CPU machines here and the two ONNX models
cannot be downloaded (docs/weights.md). Where a real module is missing, a stand-in module
with a proper `__spec__` is registered; any use of it raises `UpstreamUnavailable` naming what is
missing, so nothing silently takes its place.

Nothing here changes torch's global state. (stepaudio2 itself does at import: it sets
`torch._dynamo.config.suppress_errors` and `cache_size_limit`, upsample_encoder_v2.py L36-38; that is
the stock behaviour both modes share.)
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from importlib.metadata import PackageNotFoundError, version

#: Exact stock versions this project wraps; recorded in every result (stock-packages.txt).
STOCK_VERSIONS = {"minicpmo-utils": "1.0.7", "moshi": "0.2.13", "transformers": "5.17.0"}

_STAND_INS = ("onnxruntime", "s3tokenizer", "torchaudio", "torchaudio.compliance",
              "torchaudio.compliance.kaldi")


class UpstreamUnavailable(RuntimeError):
    """A stock code path needs a module or file that is not available on this machine."""


class _StandIn(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def unavailable(*_args, **_kwargs):
            raise UpstreamUnavailable(
                f"{self.__name__}.{attr} is not installed here; it is only used by stock prompt "
                f"preparation (stepaudio2/token2wav.py L136-156). Use the documented prompt "
                f"stand-in (duplexcadence.adapters.flow_hift.prepare_prompt) instead.")
        return unavailable


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except Exception:  # a broken native extension (torchaudio) raises OSError, not ImportError
        sys.modules.pop(name, None)
        return False


def _install_stand_ins() -> list[str]:
    installed = []
    for name in _STAND_INS:
        if name in sys.modules:
            continue
        root = name.split(".")[0]
        if root == name and _importable(name):
            continue
        if root != name and not isinstance(sys.modules.get(root), _StandIn):
            continue
        module = _StandIn(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
        module.__path__ = []  # a package, so that submodules resolve
        sys.modules[name] = module
        if "." in name:
            parent, child = name.rsplit(".", 1)
            setattr(sys.modules[parent], child, module)
        installed.append(name)
    return installed


def stepaudio2():
    """Return the stock `stepaudio2.token2wav` module (minicpmo-utils==1.0.7) with stand-ins installed.

    Raises UpstreamUnavailable if minicpmo-utils is not installed or is another version.
    """
    _check_version("minicpmo-utils")
    _install_stand_ins()
    return importlib.import_module("stepaudio2.token2wav")


def moshi():
    """moshi==0.2.13's Mimi loader and CUDA-graph / compile switches: (moshi.models.loaders,
    moshi.utils.compile). Raises UpstreamUnavailable if moshi is missing or another version."""
    _check_version("moshi")
    from moshi.models import loaders
    from moshi.utils import compile as mcompile
    return loaders, mcompile


def qwen3_omni():
    """transformers==5.17.0's Qwen3-Omni modules: (configuration_qwen3_omni_moe, modeling_qwen3_omni_moe).
    Raises UpstreamUnavailable if transformers is missing or another version."""
    _check_version("transformers")
    from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as cfg
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as modeling
    return cfg, modeling


def _check_version(package: str) -> None:
    want = STOCK_VERSIONS[package]
    try:
        have = version(package)
    except PackageNotFoundError as exc:
        raise UpstreamUnavailable(f"{package}=={want} is not installed; run `make setup`") from exc
    if have != want:
        raise UpstreamUnavailable(f"{package}: this project pins {want}, found {have}; "
                                  f"results would not be comparable. Run `make setup`.")


def installed_versions() -> dict[str, str]:
    """Versions of every package that shapes a result: stock packages, torch, numpy, and cuda-bindings, the
    distribution of the `cuda.bindings` driver API that the VMM arena and graphs.StreamLeases import
    ("absent": prealloc arenas and torch's pool streams); cuda-python, its meta-package (the `gpu` extra),
    is listed too, but a machine can have cuda-bindings without it (the lent H200's image does)."""
    out = {}
    for name in ("torch", "numpy", "minicpmo-utils", "moshi", "transformers", "librosa", "soundfile",
                 "datasets", "cuda-bindings", "cuda-python"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out
