"""What a loaded dual encoder is (private; re-exported by :mod:`retinabench.models.dual_encoder`): the loader
modules build it, so it sits below both them and the loading entry point. Importing this module imports no torch."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class DualEncoder:
    """Both towers of a CLIP-like model behind one interface. ``logit_scale`` is the multiplier exp(t) of the
    stored temperature parameter; ``logit_bias`` is None for the CLIP family (softmax head). ``pads_jointly``: a
    text's embedding depends on the texts tokenised with it (padding positions enter it: FLAIR), so how a task's
    prompts are batched is a convention (``zeroshot.siglip_text_padding``)."""

    name: str
    family: str
    module: Any
    encode_image: Callable  # normalised float NCHW -> [B, D]
    encode_text: Callable   # list[str] -> [T, D]
    input_size: int
    mean: tuple
    std: tuple
    logit_scale: float
    logit_bias: float | None
    weights: dict = field(default_factory=dict)
    pads_jointly: bool = False

    def to(self, device) -> DualEncoder:
        self.module.to(device)
        return self


def module_device(module) -> Any:
    """The device of a module's (first) parameters: where its inputs go."""
    return next(module.parameters()).device
