import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one intra-op torch thread is much faster than two (no hand-off)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_mllms(tmp_path_factory):
    """The tiny LLaVA, Qwen2-VL, LLaVA-NeXT and Gemma 3 (retinabench.testing.tiny_models), built once:
    name -> (entry, folder)."""
    from retinabench.testing.tiny_models import (build_tiny_gemma3, build_tiny_llava, build_tiny_llava_next,
                                                 build_tiny_qwen2_vl)
    root = tmp_path_factory.mktemp("tiny_mllms")
    return {name: (build(root / name), root / name)
            for name, build in (("tiny_llava", build_tiny_llava), ("tiny_qwen2_vl", build_tiny_qwen2_vl),
                                ("tiny_llava_next", build_tiny_llava_next), ("tiny_gemma3", build_tiny_gemma3))}
