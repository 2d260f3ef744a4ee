"""Small Hugging Face models built from configs with random weights (nothing downloaded): the
graphs nobody here wrote, for the PyTorch and ONNX tests."""

from __future__ import annotations

import torch
import transformers

SMALL = {"vocab_size": 96, "max_position_embeddings": 32}
VOCAB = SMALL["vocab_size"]


def hf_model(name: str, *, lm_head: bool = False) -> torch.nn.Module:
    """``bert``, ``gpt2``, ``llama`` or ``qwen2`` (grouped-query attention) or ``vit``, 2
    layers of width 64, in eval mode; with ``lm_head`` the decoders carry their language-model
    head."""
    torch.manual_seed(0)
    if name == "vit":
        config = transformers.ViTConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            image_size=32,
            patch_size=8,
        )
        return transformers.ViTModel(config, add_pooling_layer=False).eval()
    if name == "qwen2":
        config = transformers.Qwen2Config(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            use_cache=False,
            **SMALL,
        )
        cls = transformers.Qwen2ForCausalLM if lm_head else transformers.Qwen2Model
        return cls(config).eval()
    if name == "bert":
        config = transformers.BertConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            **SMALL,
        )
        return transformers.BertModel(config).eval()
    if name == "gpt2":
        config = transformers.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, n_positions=32, vocab_size=VOCAB, use_cache=False
        )
        cls = transformers.GPT2LMHeadModel if lm_head else transformers.GPT2Model
        return cls(config).eval()
    config = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        use_cache=False,
        **SMALL,
    )
    cls = transformers.LlamaForCausalLM if lm_head else transformers.LlamaModel
    return cls(config).eval()
