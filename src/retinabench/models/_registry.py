"""The loader registries' machinery (private; the public face is :mod:`retinabench.models.sources`): the registry
class, what a source loader is, the two registries and the lookups through them. The built-in loader modules import
this module to register themselves; :mod:`~retinabench.models.sources` imports them (so nothing here imports a
loader, and no import cycle exists). Importing this module imports no model library, nor torch."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from retinabench.hashing import sha256_file
from retinabench.models.strict import WeightsError
from retinabench.registry.lockfile import weights_origin

if TYPE_CHECKING:
    import torch
    from torch import nn

    from retinabench.models.strict import KeyReport

T = TypeVar("T")


class LoaderRegistry(Generic[T]):
    """Loaders by name; a second loader under a registered name is refused."""

    def __init__(self, kind: str):
        self.kind = kind
        self._loaders: dict[str, T] = {}
        # Set by retinabench.models.sources: imports the built-in loader modules before the first lookup (they
        # import this module to register, so it cannot import them).
        self.before_lookup: Callable[[], None] | None = None

    def register(self, name: str, loader: T) -> T:
        if name in self._loaders:
            raise ValueError(f"{self.kind} {name!r} is already registered ({self._loaders[name]!r}); a second "
                             f"loader under one name is refused")
        self._loaders[name] = loader
        return loader

    def _ready(self) -> None:
        if self.before_lookup is None:  # a lookup would miss the built-in loaders and blame the entry
            raise RuntimeError(f"the {self.kind} registry was used before retinabench.models.sources was imported "
                               f"(it registers the built-in loaders): import the loading API from there")
        self.before_lookup()

    def get(self, name: str, what: str) -> T:
        """The loader of ``name``; ``what`` names the entry in the error for an unknown one."""
        self._ready()
        try:
            return self._loaders[name]
        except KeyError:
            raise WeightsError(f"{what}: unknown {self.kind} {name!r}") from None

    def names(self) -> list[str]:
        self._ready()
        return sorted(self._loaders)


@dataclass(frozen=True)
class SourceLoader:
    """How one model library loads an entry.

    ``architecture(entry, device)``: the image encoder with random weights, a module ``x -> [B, D]`` with the
    entry's pooling (built under ``device``; ``meta``: shapes only). ``pretrained(entry, files, device)``: the
    same with the verified ``files`` loaded strictly -> ``(module, KeyReport, embed_dim or None)`` (the dimension
    when it had to be probed before the load, on meta). ``on_meta``: whether ``pretrained`` works on the meta
    device (a library that reads its own files, transformers' ``from_pretrained``, needs real memory).
    ``dual_encoder(entry, weights)``: both towers and the tokenizer as a
    :class:`~retinabench.models.dual_encoder.DualEncoder`; None where this library has no text tower here."""

    name: str
    architecture: Callable[[dict, torch.device], nn.Module]
    pretrained: Callable[[dict, dict[str, Path], torch.device], tuple[nn.Module, KeyReport, int | None]]
    on_meta: bool = True
    dual_encoder: Callable[..., Any] | None = None


WeightFiles = Callable[[dict], tuple[dict[str, Path], dict]]
SOURCES: LoaderRegistry[SourceLoader] = LoaderRegistry("source")
ORIGINS: LoaderRegistry[WeightFiles] = LoaderRegistry("weights origin")
# Whole dual encoders whose text tower is none of a library's (the entry's ``text_tower.kind``: RET-CLIP's Chinese
# BERT, FLAIR's BioClinicalBERT): ``load(entry, weights) -> DualEncoder``. Registered by ``_ret_clip``, ``_flair``.
TEXT_TOWERS: LoaderRegistry[Callable[..., Any]] = LoaderRegistry("text tower")


def register_text_tower(kind: str, load: Callable[..., Any]) -> Callable[..., Any]:
    return TEXT_TOWERS.register(kind, load)


def register_source(loader: SourceLoader) -> SourceLoader:
    return SOURCES.register(loader.name, loader)


def register_origin(origin: str, files: WeightFiles) -> WeightFiles:
    """``files(entry) -> ({file name: path}, provenance)``: the entry's files, each verified against its pin."""
    return ORIGINS.register(origin, files)


def source_loader(entry: dict) -> SourceLoader:
    return SOURCES.get(entry["source"], f"encoder {entry['name']!r}")


def build_architecture(entry: dict, device: str | torch.device | None = None) -> nn.Module:
    """The entry's image encoder with random weights (``device="meta"``: no memory, shapes only)."""
    import torch
    ctx = torch.device(device) if device is not None else torch.device("cpu")
    loader = source_loader(entry)
    with ctx:
        return loader.architecture(entry, ctx)


def weight_files(entry: dict, weights: str | Path | None = None) -> tuple[dict[str, Path], dict]:
    """The verified files an entry loads (name -> path) and their provenance, from the loader of its origin.

    ``weights``: a local file (a directory for transformers entries) in the *published* layout, used instead of
    the pinned source — what ``retinabench check-encoder --weights`` passes; its sha256 is recorded, not checked.
    """
    what = f"encoder {entry['name']!r}"
    if weights is not None:
        p = Path(weights).expanduser()
        if not p.exists():
            raise WeightsError(f"{what}: {p} does not exist")
        files = {f.name: f for f in sorted(p.iterdir()) if f.is_file()} if p.is_dir() else {p.name: p}
        return files, {"origin": "local file", "files": {k: sha256_file(v) for k, v in files.items()}}
    return ORIGINS.get(weights_origin(entry), what)(entry)
