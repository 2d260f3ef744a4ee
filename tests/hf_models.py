"""Small Hugging Face models built from configs with random weights (nothing downloaded): the
graphs nobody here wrote, for the PyTorch and ONNX tests."""

from __future__ import annotations

from collections.abc import Callable

import torch
import transformers

SMALL = {"vocab_size": 96, "max_position_embeddings": 32}
VOCAB = SMALL["vocab_size"]
DECODER_SIZE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "use_cache": False,
}
# More decoders (with their language-model heads): config class, model class, extra settings.
DECODERS = {
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    # q and k normalised per head: an RMSNorm over [batch, sequence, heads, head_dim]
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
}


def hf_model(name: str, *, lm_head: bool = False) -> torch.nn.Module:
    """``bert``, ``gpt2``, ``llama``, ``qwen2``, ``mistral``, ``gemma2``, ``phi3``, ``qwen3``
    (grouped-query attention) or ``vit``, 2 layers of width 64, in eval mode; with ``lm_head`` the
    decoders carry their language-model head. ``t5`` is a T5 encoder-decoder with its head
    (it takes ``input_ids`` and ``decoder_input_ids``)."""
    torch.manual_seed(0)
    if name in DECODERS:
        config_class, model_class, extra = DECODERS[name]
        config = getattr(transformers, config_class)(**DECODER_SIZE, **extra, **SMALL)
        return getattr(transformers, model_class)(config).eval()
    if name == "t5":
        config = transformers.T5Config(
            vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4
        )
        config.use_cache = False
        return transformers.T5ForConditionalGeneration(config).eval()
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


def as_they_come(name: str) -> tuple[torch.nn.Module, Callable[[int], dict[str, torch.Tensor]]]:
    """``llama``, ``mistral``, ``t5``, ``whisper`` or ``vit`` with its config's defaults (caches
    on, sliding windows, relative attention...) but 2 small layers, in eval mode, and a maker of
    keyword inputs for a batch of a given size."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)

    def ids(batch: int, length: int) -> torch.Tensor:
        return torch.randint(1, VOCAB, (batch, length), generator=generator)

    width = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}
    decoder = {**width, "num_hidden_layers": 2, "num_key_value_heads": 2, **SMALL}
    if name in ("llama", "mistral"):
        config_class = transformers.LlamaConfig if name == "llama" else transformers.MistralConfig
        model_class = transformers.LlamaModel if name == "llama" else transformers.MistralModel
        return model_class(config_class(**decoder)).eval(), lambda b: {"input_ids": ids(b, 12)}
    if name == "t5":
        config = transformers.T5Config(
            d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=VOCAB
        )
        return transformers.T5Model(config).eval(), lambda b: {
            "input_ids": ids(b, 12),
            "decoder_input_ids": ids(b, 5),
        }
    if name == "whisper":
        config = transformers.WhisperConfig(
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            num_mel_bins=16,
            max_source_positions=16,
            max_target_positions=32,
        )
        return transformers.WhisperModel(config).eval(), lambda b: {
            "input_features": torch.randn(b, 16, 32, generator=generator),
            "decoder_input_ids": ids(b, 5),
        }
    config = transformers.ViTConfig(**width, num_hidden_layers=2, image_size=32, patch_size=8)
    return transformers.ViTModel(config).eval(), lambda b: {
        "pixel_values": torch.randn(b, 3, 32, 32, generator=generator)
    }
