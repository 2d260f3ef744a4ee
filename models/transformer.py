"""BERT-base-style encoder and GPT-2-style decoder, written out (no fused attention), so the
exported graph shows the MatMul / Softmax / LayerNorm structure an AMP pass must handle."""

from __future__ import annotations

import math

import torch
from torch import nn

BERT_SIZES = {
    "full": {
        "vocab": 30522,
        "hidden": 768,
        "layers": 12,
        "heads": 12,
        "ffn": 3072,
        "seq": 128,
        "batch": 8,
    },
    "small": {
        "vocab": 128,
        "hidden": 32,
        "layers": 2,
        "heads": 2,
        "ffn": 64,
        "seq": 16,
        "batch": 2,
    },
}
GPT_SIZES = {
    "full": {
        "vocab": 50257,
        "hidden": 768,
        "layers": 12,
        "heads": 12,
        "ffn": 3072,
        "seq": 128,
        "batch": 8,
    },
    "small": {
        "vocab": 128,
        "hidden": 32,
        "layers": 2,
        "heads": 2,
        "ffn": 64,
        "seq": 16,
        "batch": 2,
    },
}


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.output = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, seq, self.heads, head_dim).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_dim)
        if self.causal:
            mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.output(context.transpose(1, 2).reshape(batch, seq, hidden))


class Block(nn.Module):
    """Post-norm (BERT) or pre-norm (GPT-2) transformer block."""

    def __init__(self, hidden: int, heads: int, ffn: int, causal: bool) -> None:
        super().__init__()
        self.pre_norm = causal
        self.attention = SelfAttention(hidden, heads, causal)
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attention(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.mlp(x))


class BertEncoder(nn.Module):
    def __init__(
        self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, seq: int
    ) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, ffn, causal=False) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.norm(
            self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
        )
        for layer in self.layers:
            x = layer(x)
        return x, torch.tanh(self.pooler(x[:, 0]))


class GptDecoder(nn.Module):
    def __init__(
        self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, seq: int
    ) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, ffn, causal=True) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word(input_ids) + self.position(positions)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) @ self.word.weight.t()  # tied language-model head


def build_bert(size: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    c = BERT_SIZES[size]
    model = BertEncoder(c["vocab"], c["hidden"], c["layers"], c["heads"], c["ffn"], c["seq"])
    ids = torch.randint(1, c["vocab"], (c["batch"], c["seq"]))
    types = torch.randint(0, 2, (c["batch"], c["seq"]))
    return model, (ids, types)


def build_gpt(size: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    c = GPT_SIZES[size]
    model = GptDecoder(c["vocab"], c["hidden"], c["layers"], c["heads"], c["ffn"], c["seq"])
    return model, (torch.randint(1, c["vocab"], (c["batch"], c["seq"])),)
