"""Where torch.export cuts a stack at a call into a callable object (issue 28).

torch.export keeps only the ``forward`` frames of each node's stack. diffusers'
``Attention.forward`` is one line, ``return self.processor(attn, hidden_states, ...)``:
the processor's ``__call__`` — the projections, the attention and the output projection
— is no ``forward``, so every one of those ops had that line as its deepest frame, and a
``diffusers`` UNet's top site was ``attention_processor.py: return self.processor(``
for self- and cross-attention of every block alike. The PyTorch frontend now says so
(one note at export, and a ``name_path`` entry on each such op) and falls back to the
line that runs the module (``attn_output = self.attn1(`` / ``self.attn2(``).

The UNet is a ``UNet2DConditionModel`` built here from a config with random weights."""

from __future__ import annotations

import inspect
import linecache
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e .[frontends])")
diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed (pip install -e .[test])")

pytestmark = [pytest.mark.slow, pytest.mark.frontends]


def _unet() -> tuple[Any, tuple[Any, ...]]:
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32,),
        down_block_types=("CrossAttnDownBlock2D",), up_block_types=("CrossAttnUpBlock2D",),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8).eval()
    return unet, (torch.randn(1, 4, 8, 8), torch.tensor(10), torch.randn(1, 4, 32))


def _processor_line() -> tuple[str, int]:
    """File and line of ``return self.processor(`` in diffusers' ``Attention.forward``."""
    from diffusers.models.attention_processor import Attention

    lines, first = inspect.getsourcelines(Attention.forward)
    offset = next(i for i, line in enumerate(lines) if "return self.processor(" in line)
    return str(Path(inspect.getsourcefile(Attention.forward) or "").resolve()), first + offset


def test_attention_ops_fall_back_to_the_line_running_their_module(tmp_path: Path,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    from dfit_mlir.analysis.model import SemanticModel
    from dfit_mlir.analysis.tools.builtin.semantic_attribution import explain_site, op_site
    from dfit_mlir.frontends import site_notes
    from dfit_mlir.frontends import torch as torch_frontend

    unet, args = _unet()
    processor_file, processor_line = _processor_line()
    # The note is printed only where torch.export's stacks ended on the processor call.
    result = torch_frontend.compile(unet, args, output=tmp_path / "unet.vmfb", mode="ids", quiet=True)
    notes = [line for line in capfd.readouterr().err.splitlines() if "torch.export cut the stack" in line]
    assert len(notes) == 1, notes  # one line, however many ops went through it
    assert f"{processor_file}:{processor_line} `return self.processor(`" in notes[0]
    assert "AttnProcessor2_0.__call__" in notes[0] and "the line that runs their module" in notes[0]

    model = SemanticModel.open(result.manifest_path)
    sites = {op.id: op_site(model, op) for op in model.operators.values()}
    assert all(site is None or site[0] != f"{processor_file}:{processor_line}" for site in sites.values())
    by_attention: dict[str, set[str]] = {}
    for op in model.operators.values():
        path = model.module_path(op.id) or ""
        attention = next((part for part in path.split(".") if part in ("attn1", "attn2")), None)
        cut = site_notes(op.name_path)  # what --explain-site prints beside the frames
        if attention is None or not cut or sites[op.id] is None:
            continue
        assert f"attention_processor.py:{processor_line}" in cut[0] and "AttnProcessor2_0.__call__" in cut[0]
        file, line = sites[op.id][0].rsplit(":", 1)
        by_attention.setdefault(attention, set()).add(linecache.getline(file, int(line)).strip())
    # Self- and cross-attention each on the line of its parent's forward that runs it.
    assert by_attention == {"attn1": {"attn_output = self.attn1("}, "attn2": {"attn_output = self.attn2("}}
    # --explain-site says why, beside the frames.
    attn1_site = next(sites[op.id][0] for op in model.operators.values()  # type: ignore[index]
                      if ".attn1" in (model.module_path(op.id) or "") and site_notes(op.name_path))
    explained = explain_site(model, attn1_site)
    assert f"note: {processor_file}:{processor_line} `return self.processor(` calls AttnProcessor2_0.__call__" \
        in explained
