"""Small Hugging Face models exported by Optimum, and greedy generation with its ORTModel
classes: the Optimum side of the tests and of tools/bench_control_flow.py.

Run with the interpreter of the Optimum environment (``bash tools/optimum_env.sh`` prints it):
optimum-onnx pins its own transformers, so this script never runs in the project's .venv and
imports nothing of graphamp. Nothing is downloaded: each model is built from a small config with
random weights (fixed seeds), its tokenizer from a made-up word list, and both are saved to a
folder that Optimum's exporter reads as it would read a hub checkpoint.

    python tools/optimum_models.py export t5 OUT        # OUT: encoder_model.onnx,
        # decoder_model.onnx, decoder_with_past_model.onnx, decoder_model_merged.onnx,
        # config.json, generation_config.json, tokenizer files (as optimum-cli export onnx
        # --task text2text-generation-with-past writes them)
    python tools/optimum_models.py export llama OUT     # OUT/model.onnx (text-generation-with-past)
    python tools/optimum_models.py generate OUT [--unmerged]   # JSON on stdout

``generate`` loads the folder with ``ORTModelForSeq2SeqLM`` or ``ORTModelForCausalLM``
(``use_cache=True``; a seq2seq folder's merged decoder unless ``--unmerged``), greedy-generates
``--new-tokens`` tokens for ``--prompts`` prompts made from a seeded word list, and prints
``{"tokens": [[...], ...], "min_margin": m, "decoder": file}``: ``min_margin`` is the smallest
gap between the best and the second-best logit over every generated token, how far the
float32 choice is from flipping (a float16 run that picks the same tokens is a claim worth as
much as that margin).

The weights are random, drawn at a larger scale than the library defaults (T5's
``initializer_factor``, BART's ``init_std``, Llama's ``initializer_range``): at the defaults a
2-layer model of width 64 greedy-generates one token over and over whatever the prompt, and
such a run would compare nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

VOCAB = 96
SPECIAL = ["<pad>", "</s>", "<unk>", "<s>"]  # ids 0..3: pad, eos, unk, bos
SEQ2SEQ = ("t5", "bart")
CAUSAL = ("llama",)


def tokenizer():  # type: ignore[no-untyped-def]
    """A word-level tokenizer over ``w0 .. w91`` and the special tokens (ids as SPECIAL)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
    vocab = {token: index for index, token in enumerate(SPECIAL + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        bos_token="<s>",
    )


def model(kind: str):  # type: ignore[no-untyped-def]
    """A 2-layer model of width 64 with random weights (seed 0), in eval mode."""
    import torch
    import transformers

    torch.manual_seed(0)
    ids = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 3}
    if kind == "t5":
        config = transformers.T5Config(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            initializer_factor=8.0,
            **ids,
        )
        return transformers.T5ForConditionalGeneration(config).eval()
    if kind == "bart":
        config = transformers.BartConfig(
            vocab_size=VOCAB,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=64,
            decoder_start_token_id=1,
            forced_eos_token_id=None,
            init_std=0.5,
            **ids,
        )
        return transformers.BartForConditionalGeneration(config).eval()
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=64,
            initializer_range=0.2,
            **ids,
        )
        return transformers.LlamaForCausalLM(config).eval()
    raise SystemExit(f"optimum_models: unknown model {kind!r}: choose {SEQ2SEQ + CAUSAL}")


def export(kind: str, output: Path) -> None:
    """Export ``kind`` with its cache, as optimum-cli export onnx does, to ``output``."""
    from optimum.exporters.onnx import main_export

    task = "text2text-generation-with-past" if kind in SEQ2SEQ else "text-generation-with-past"
    with tempfile.TemporaryDirectory(prefix="optimum-checkpoint-") as checkpoint:
        model(kind).save_pretrained(checkpoint)
        tokenizer().save_pretrained(checkpoint)
        main_export(checkpoint, output, task=task, device="cpu")
    for leftover in output.glob("*.py"):  # none expected; keep the folder as users get it
        leftover.unlink()


def prompts(count: int, length: int) -> list[str]:
    """``count`` prompts of ``length`` words, drawn with a fixed seed."""
    import random

    draw = random.Random(1)
    return [
        " ".join(f"w{draw.randrange(VOCAB - len(SPECIAL))}" for _ in range(length))
        for _ in range(count)
    ]


def generate(folder: Path, *, count: int, length: int, new_tokens: int, unmerged: bool) -> dict:
    """Greedy generation on ``folder`` with Optimum's ORTModel classes (module docstring)."""
    import torch
    import transformers
    from optimum.onnxruntime import ORTModelForCausalLM, ORTModelForSeq2SeqLM

    torch.set_num_threads(1)
    config = transformers.AutoConfig.from_pretrained(folder)
    if config.is_encoder_decoder:
        loaded = ORTModelForSeq2SeqLM.from_pretrained(
            folder, use_cache=True, use_merged=False if unmerged else None
        )
        decoders = [loaded.decoder.path.name]
        if unmerged and getattr(loaded, "decoder_with_past", None) is not None:
            decoders.append(loaded.decoder_with_past.path.name)
    else:
        loaded = ORTModelForCausalLM.from_pretrained(folder, use_cache=True)
        decoders = [Path(loaded.model_path).name]
    words = transformers.AutoTokenizer.from_pretrained(folder)
    batch = words(
        prompts(count, length), return_tensors="pt", padding=True, return_token_type_ids=False
    )
    out = loaded.generate(
        **batch,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
    )
    tokens = out.sequences[:, -new_tokens:].tolist()
    best_two = [scores.topk(2).values for scores in out.scores]
    margins = [float((top[:, 0] - top[:, 1]).min()) for top in best_two]
    return {"tokens": tokens, "min_margin": min(margins), "decoders": decoders}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    exporting = commands.add_parser("export", help="export a small model to a folder")
    exporting.add_argument("kind", choices=SEQ2SEQ + CAUSAL)
    exporting.add_argument("output", type=Path)
    generating = commands.add_parser("generate", help="greedy generation on an exported folder")
    generating.add_argument("folder", type=Path)
    generating.add_argument("--prompts", type=int, default=4)
    generating.add_argument("--prompt-words", type=int, default=8)
    generating.add_argument("--new-tokens", type=int, default=16)
    generating.add_argument(
        "--unmerged", action="store_true", help="decoder_model + decoder_with_past_model"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.command == "export":
        if args.output.exists() and any(args.output.iterdir()):
            raise SystemExit(f"optimum_models: {args.output} is not empty")
        export(args.kind, args.output)
        print(json.dumps(sorted(p.name for p in args.output.iterdir())))
    else:
        result = generate(
            args.folder,
            count=args.prompts,
            length=args.prompt_words,
            new_tokens=args.new_tokens,
            unmerged=args.unmerged,
        )
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
