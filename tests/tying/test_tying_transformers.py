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


def _encoder(model: str, config: str, **sizes: Any) -> Callable[..., nn.Module]:
    """A builder for a tiny ``transformers.<model>(transformers.<config>(...))``."""

    def build(**config_kwargs: Any) -> nn.Module:
        import transformers

        settings = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 1}
        settings.update(num_attention_heads=2, max_position_embeddings=66)
        config_class = getattr(transformers, config)
        module: nn.Module = getattr(transformers, model)(
            config_class(**settings, **sizes, **config_kwargs)
        )
        return module

    return build


BUILDERS: dict[str, Callable[..., nn.Module]] = {"gpt2": _gpt2, "t5": _t5, "bart": _bart}
#: The families of the issue's untied-checkpoint case, beside the three above.
MORE_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "bert": _encoder("BertForMaskedLM", "BertConfig", intermediate_size=64),
    "roberta": _encoder("RobertaForMaskedLM", "RobertaConfig", intermediate_size=64),
    "albert": _encoder(
        "AlbertForMaskedLM", "AlbertConfig", intermediate_size=64, embedding_size=16
    ),
    "opt": _encoder("OPTForCausalLM", "OPTConfig", ffn_dim=64, word_embed_proj_dim=32),
    "llama": _encoder(
        "LlamaForCausalLM", "LlamaConfig", intermediate_size=64, num_key_value_heads=2
    ),
}
FAMILIES = {**BUILDERS, **MORE_BUILDERS}
#: Loaded untied despite tie_word_embeddings=True. Not T5: transformers 5 ties its
#: head to the embedding on load (the saved head is dropped), so no move sees it untied.
STAYS_UNTIED = sorted(set(FAMILIES) - {"t5"})
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


def _embedding_names(model: nn.Module) -> tuple[str, str]:
    """The qualified names of the input and output embedding weights."""
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    inputs = model.get_input_embeddings().weight  # type: ignore[operator]
    outputs = model.get_output_embeddings().weight  # type: ignore[operator]
    return names[id(inputs)], names[id(outputs)]


def _untied_checkpoint_loaded_tying(name: str, directory: Path) -> nn.Module:
    """The issue's repro: saved untied, loaded with ``tie_word_embeddings=True``."""
    torch.manual_seed(0)
    saved = FAMILIES[name](tie_word_embeddings=False)
    saved.save_pretrained(directory)
    model: nn.Module = type(saved).from_pretrained(directory, tie_word_embeddings=True)
    # The premise: transformers refuses to tie weights that differ, so the output
    # embedding stays a tensor of its own (other ties, such as BERT's bias, stay).
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight  # type: ignore[operator]
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


@pytest.mark.parametrize("name", STAYS_UNTIED)
def test_an_untied_checkpoint_with_a_tying_config_moves_untied_with_a_warning(
    name: str, tmp_path: Path, tpu: accel.Accelerator, cpu: accel.Accelerator
) -> None:
    model = _untied_checkpoint_loaded_tying(name, tmp_path)
    groups, count = _groups(model), count_unique_parameters(model)
    values = _values(model)
    reference = _logits(model)
    embedding, output = _embedding_names(model)

    # A bare .to() keeps the head untied (though it unties BERT's bias tie): accel must
    # not do worse.
    bare = copy.deepcopy(model).to(tpu.device)
    assert bare.get_output_embeddings().weight is not bare.get_input_embeddings().weight  # type: ignore[operator]

    # The default tie_check="error": accel undid the tie tie_weights() made, so the
    # model is exactly as it was, and it moves, with a warning, as transformers gives.
    assert tpu.tie_check == "error"
    with pytest.warns(TyingWarning) as record:
        moved = tpu.model_to_device(model)
    (warning,) = [w for w in record if w.category is TyingWarning]
    message = str(warning.message)
    assert message.startswith(f"new ties appeared moving the model to {tpu.device}.")
    assert "came apart" not in message
    assert "tie_word_embeddings" in message
    assert any(embedding in line and output in line for line in message.splitlines())
    assert moved is model
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight  # type: ignore[operator]
    assert _groups(model) == groups and count_unique_parameters(model) == count
    assert all(p.device == tpu.device for p in model.parameters())
    _assert_same_values(model, values)
    torch.testing.assert_close(_logits(model), reference)

    cpu.tie_check = "off"  # and back, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error", TyingWarning)
        model = cpu.model_to_device(model)
    assert _groups(model) == groups and count_unique_parameters(model) == count
    assert all(p.device.type == "cpu" for p in model.parameters())
    _assert_same_values(model, values)
    torch.testing.assert_close(_logits(model), reference)


def test_the_issue_repro_warning_names_the_head_and_embedding(
    tmp_path: Path, tpu: accel.Accelerator
) -> None:
    model = _untied_checkpoint_loaded_tying("gpt2", tmp_path)
    with pytest.warns(TyingWarning) as record:
        tpu.model_to_device(model)
    (warning,) = [w for w in record if w.category is TyingWarning]
    lines = str(warning.message).splitlines()
    assert lines[0] == (
        "new ties appeared moving the model to xla:0. Layer count: [Before: 17 After: 16]"
    )
    assert lines[1:3] == [
        "Groups newly tied (separate tensors before the move, one tensor after it):",
        "  - parameters transformer.wte.weight, lm_head.weight",
    ]
    assert lines[-1] == (
        "The move went ahead: the model keeps the ties and values it had before the move. "
        "Pass tie_check='off' to get_accelerator() to silence this warning."
    )
