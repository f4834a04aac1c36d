"""Hugging Face transformers models on real XLA: ties kept both ways, and never changed.

transformers is installed in the XLA tier only. Every model is built in code from a
tiny config; checkpoints are saved to and loaded from ``tmp_path``, never downloaded.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import accel
from accel import TyingWarning
from accel.tying import count_unique_parameters, find_tied_parameters

pytestmark = pytest.mark.xla


def _gpt2(**config: Any) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=99, n_positions=64, **config)
    )


def _t5(**config: Any) -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(
        T5Config(
            vocab_size=99,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=1,
            num_decoder_layers=1,
            num_heads=2,
            **config,
        )
    )


def _bart(**config: Any) -> nn.Module:
    from transformers import BartConfig, BartForConditionalGeneration

    return BartForConditionalGeneration(
        BartConfig(
            vocab_size=99,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            **config,
        )
    )


BUILDERS: dict[str, Callable[..., nn.Module]] = {"gpt2": _gpt2, "t5": _t5, "bart": _bart}
_EMBEDDINGS = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
TIED_GROUPS = {
    "gpt2": [("transformer.wte.weight", "lm_head.weight")],
    "t5": [(*_EMBEDDINGS, "lm_head.weight")],
    "bart": [(*(f"model.{name}" for name in _EMBEDDINGS), "lm_head.weight")],
}


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("tpu")


@pytest.fixture
def cpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("cpu")


def _groups(model: nn.Module) -> list[tuple[str, ...]]:
    return [group.names for group in find_tied_parameters(model)]


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}


def _assert_same_values(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert set(state) == set(values)
    for name, value in state.items():
        assert torch.equal(value.cpu(), values[name]), name


def _logits(model: nn.Module) -> torch.Tensor:
    device = next(model.parameters()).device
    tokens = torch.arange(3, 11).unsqueeze(0).to(device)
    inputs = {"input_ids": tokens}
    if model.config.is_encoder_decoder:  # type: ignore[union-attr]
        inputs["decoder_input_ids"] = tokens
    with torch.no_grad():
        logits: torch.Tensor = model(**inputs).logits
    return logits.cpu()


def _untied_checkpoint_loaded_tying(name: str, directory: Path) -> nn.Module:
    """The issue's repro: saved untied, loaded with ``tie_word_embeddings=True``."""
    torch.manual_seed(0)
    saved = BUILDERS[name](tie_word_embeddings=False)
    saved.save_pretrained(directory)
    model: nn.Module = type(saved).from_pretrained(directory, tie_word_embeddings=True)
    # The premise: transformers refuses to tie weights that differ, so it stays untied.
    assert _groups(model) == []
    return model


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_tied_model_keeps_every_tie_and_value_there_and_back(
    name: str, tpu: accel.Accelerator, cpu: accel.Accelerator
) -> None:
    torch.manual_seed(0)
    model = BUILDERS[name]().eval()
    assert _groups(model) == TIED_GROUPS[name]
    count = count_unique_parameters(model)
    values = _values(model)
    reference = _logits(model)
    for step, acc in enumerate((tpu, cpu, tpu)):  # CPU -> XLA -> CPU -> XLA
        model = acc.model_to_device(model)
        assert _groups(model) == TIED_GROUPS[name], (step, acc.name)
        assert count_unique_parameters(model) == count, (step, acc.name)
        assert all(p.device == acc.device for p in model.parameters())
        _assert_same_values(model, values)
    torch.testing.assert_close(_logits(model), reference)


@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_an_untied_checkpoint_with_a_tying_config_is_not_tied_by_a_move(
    name: str, tmp_path: Path, tpu: accel.Accelerator, cpu: accel.Accelerator
) -> None:
    model = _untied_checkpoint_loaded_tying(name, tmp_path)
    count = count_unique_parameters(model)
    values = _values(model)
    reference = _logits(model)
    head = model.lm_head.weight  # type: ignore[union-attr]

    # A bare .to() moves it correctly (untied stays untied): accel must not do worse.
    bare = copy.deepcopy(model).to(tpu.device)
    assert _groups(bare) == [] and count_unique_parameters(bare) == count

    with pytest.raises(accel.WeightTyingError) as info:
        tpu.model_to_device(model)
    error = info.value
    assert error.broken_groups == []
    assert error.appeared_groups == TIED_GROUPS[name]
    assert error.count_before == count and error.count_after < count
    message = str(error)
    assert message.startswith(f"new ties appeared moving the model to {tpu.device}.")
    assert "came apart" not in message
    assert "tie_word_embeddings" in message
    # Restored: still on the CPU, untied, with the head's own trained weight.
    assert model.lm_head.weight is head and head.device.type == "cpu"  # type: ignore[union-attr]
    assert _groups(model) == []

    tpu.tie_check = "warn"
    with pytest.warns(TyingWarning, match="new ties appeared"):
        model = tpu.model_to_device(model)
    assert _groups(model) == [] and count_unique_parameters(model) == count
    _assert_same_values(model, values)  # the head was not replaced by the embedding
    torch.testing.assert_close(_logits(model), reference)

    cpu.tie_check = "off"
    with warnings.catch_warnings():
        warnings.simplefilter("error", TyingWarning)
        model = cpu.model_to_device(model)
    assert _groups(model) == [] and count_unique_parameters(model) == count
    assert all(p.device.type == "cpu" for p in model.parameters())
    _assert_same_values(model, values)
    torch.testing.assert_close(_logits(model), reference)


def test_the_issue_repro_error_names_the_head_and_embedding(
    tmp_path: Path, tpu: accel.Accelerator
) -> None:
    model = _untied_checkpoint_loaded_tying("gpt2", tmp_path)
    with pytest.raises(accel.WeightTyingError) as info:
        tpu.model_to_device(model)
    lines = str(info.value).splitlines()
    assert lines[0] == (
        "new ties appeared moving the model to xla:0. Layer count: [Before: 17 After: 16]"
    )
    assert lines[1:3] == [
        "Groups newly tied (separate tensors before the move, one tensor after it):",
        "  - parameters transformer.wte.weight, lm_head.weight",
    ]
