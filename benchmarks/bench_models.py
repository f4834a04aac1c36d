"""The benchmark models, built in code (nothing is downloaded).

Each reproduces the module structure and the ties of a well-known architecture; the
tied-weight benchmarks only look at structure, so the ALBERT- and T5-style models
have no ``forward``. Pass ``device="meta"`` to build any size without memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "GPT2_48",
    "GPT2_SMALL",
    "GPT2Config",
    "albert_style",
    "gpt2_style",
    "millions",
    "t5_style",
    "unique_parameter_count",
]


# -- GPT-2: one embedding tied to the output projection --------------------------------


@dataclass(frozen=True)
class GPT2Config:
    vocab: int = 50257
    positions: int = 1024
    width: int = 768
    layers: int = 12
    heads: int = 12


#: GPT-2 small (124M parameters) and GPT-2 XL's depth and width (48 layers, 1600 wide).
GPT2_SMALL = GPT2Config()
GPT2_48 = GPT2Config(width=1600, layers=48, heads=25)


class _GPT2Attention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.heads = config.heads
        self.c_attn = nn.Linear(config.width, 3 * config.width)
        self.c_proj = nn.Linear(config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(batch, length, width))


class _GPT2MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.width, 4 * config.width)
        self.c_proj = nn.Linear(4 * config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class _GPT2Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.width)
        self.attn = _GPT2Attention(config)
        self.ln_2 = nn.LayerNorm(config.width)
        self.mlp = _GPT2MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2LM(nn.Module):
    """A GPT-2 language model; ``lm_head.weight`` is ``wte.weight``."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab, config.width)
        self.wpe = nn.Embedding(config.positions, config.width)
        self.h = nn.ModuleList(_GPT2Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt2_style(config: GPT2Config = GPT2_48, *, device: str = "meta") -> GPT2LM:
    with torch.device(device):
        return GPT2LM(config)


# -- ALBERT: every layer of the stack shares the first layer's parameters --------------


class _AlbertLayer(nn.Module):
    def __init__(self, width: int, ffn: int) -> None:
        super().__init__()
        self.attention = nn.ModuleDict(
            {
                "query": nn.Linear(width, width),
                "key": nn.Linear(width, width),
                "value": nn.Linear(width, width),
                "dense": nn.Linear(width, width),
                "LayerNorm": nn.LayerNorm(width),
            }
        )
        self.ffn = nn.Linear(width, ffn)
        self.ffn_output = nn.Linear(ffn, width)
        self.full_layer_layer_norm = nn.LayerNorm(width)


class AlbertStyle(nn.Module):
    """``layers`` distinct layer modules holding one layer's Parameter objects."""

    def __init__(self, layers: int, width: int = 768, ffn: int = 3072, vocab: int = 30000) -> None:
        super().__init__()
        embedding = 128
        self.embeddings = nn.ModuleDict(
            {
                "word_embeddings": nn.Embedding(vocab, embedding),
                "position_embeddings": nn.Embedding(512, embedding),
                "token_type_embeddings": nn.Embedding(2, embedding),
                "LayerNorm": nn.LayerNorm(embedding),
            }
        )
        self.embedding_hidden_mapping_in = nn.Linear(embedding, width)
        self.layer = nn.ModuleList(_AlbertLayer(width, ffn) for _ in range(layers))
        first = self.layer[0]
        for other in self.layer[1:]:
            for source, target in zip(first.modules(), other.modules(), strict=True):
                for name in source._parameters:
                    target._parameters[name] = source._parameters[name]
        self.pooler = nn.Linear(width, width)


def albert_style(layers: int, *, device: str = "meta", width: int = 768) -> AlbertStyle:
    with torch.device(device):
        return AlbertStyle(layers, width=width, ffn=4 * width)


# -- T5: encoder and decoder embeddings are the shared embedding (a three-way tie) -----


class _T5LayerNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))


class _T5Attention(nn.Module):
    def __init__(self, width: int, heads: int, relative_bias: bool) -> None:
        super().__init__()
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, width, bias=False)
        self.v = nn.Linear(width, width, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        if relative_bias:
            self.relative_attention_bias = nn.Embedding(32, heads)


class _T5Sublayer(nn.Module):
    def __init__(self, width: int, body: nn.Module, body_name: str) -> None:
        super().__init__()
        self.add_module(body_name, body)
        self.layer_norm = _T5LayerNorm(width)


class _T5DenseReluDense(nn.Module):
    def __init__(self, width: int, ffn: int) -> None:
        super().__init__()
        self.wi = nn.Linear(width, ffn, bias=False)
        self.wo = nn.Linear(ffn, width, bias=False)


class _T5Block(nn.Module):
    def __init__(self, width: int, ffn: int, heads: int, *, first: bool, decoder: bool) -> None:
        super().__init__()
        layers = [_T5Sublayer(width, _T5Attention(width, heads, first), "SelfAttention")]
        if decoder:
            layers.append(_T5Sublayer(width, _T5Attention(width, heads, False), "EncDecAttention"))
        layers.append(_T5Sublayer(width, _T5DenseReluDense(width, ffn), "DenseReluDense"))
        self.layer = nn.ModuleList(layers)


class _T5Stack(nn.Module):
    def __init__(
        self, embed_tokens: nn.Embedding, layers: int, ffn: int, heads: int, decoder: bool
    ) -> None:
        super().__init__()
        width = embed_tokens.embedding_dim
        self.embed_tokens = embed_tokens
        self.block = nn.ModuleList(
            _T5Block(width, ffn, heads, first=i == 0, decoder=decoder) for i in range(layers)
        )
        self.final_layer_norm = _T5LayerNorm(width)


class T5Style(nn.Module):
    """T5 v1.1 layout; ``shared``, ``encoder.embed_tokens`` and ``decoder.embed_tokens``
    are three Embedding modules holding one weight Parameter.
    """

    def __init__(self, width: int = 768, layers: int = 12, vocab: int = 32128) -> None:
        super().__init__()
        heads, ffn = max(1, width // 64), 4 * width
        self.shared = nn.Embedding(vocab, width)
        encoder_embed = nn.Embedding(vocab, width)
        decoder_embed = nn.Embedding(vocab, width)
        encoder_embed.weight = decoder_embed.weight = self.shared.weight
        self.encoder = _T5Stack(encoder_embed, layers, ffn, heads, decoder=False)
        self.decoder = _T5Stack(decoder_embed, layers, ffn, heads, decoder=True)
        self.lm_head = nn.Linear(width, vocab, bias=False)


def t5_style(*, device: str = "meta", width: int = 768) -> T5Style:
    with torch.device(device):
        return T5Style(width=width)


def millions(count: int) -> str:
    return f"{count / 1e6:.0f}M" if count >= 1e6 else f"{count / 1e3:.0f}k"


def unique_parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
