"""Small Hugging Face models exported by Optimum, and greedy generation with its ORTModel
classes: the Optimum side of the tests and of tools/bench/bench_control_flow.py.

Run with the interpreter of the Optimum environment (``bash tools/optimum_env.sh`` prints it):
optimum-onnx pins its own transformers, so this script never runs in the project's .venv and
imports nothing of graphamp. Nothing is downloaded: each model is built from a small config with
random weights (fixed seeds, then a few seconds of training on a synthetic task), its tokenizer
from a made-up word list, and both are saved to a folder that Optimum's exporter reads as it
would read a hub checkpoint.

    python tools/bench/optimum_models.py export t5 OUT        # OUT: encoder_model.onnx,
        # decoder_model.onnx, decoder_with_past_model.onnx, decoder_model_merged.onnx,
        # config.json, generation_config.json, tokenizer files (as optimum-cli export onnx
        # --task text2text-generation-with-past writes them)
    python tools/bench/optimum_models.py export llama OUT     # OUT/model.onnx
    (text-generation-with-past) python tools/bench/optimum_models.py checkpoint t5 DIR    # the
    model and tokenizer, unexported python tools/bench/optimum_models.py generate OUT [OUT2#unmerged
    ...]   # JSON on stdout

``generate`` loads each folder with ``ORTModelForSeq2SeqLM`` or ``ORTModelForCausalLM``
(``use_cache=True``; a seq2seq folder's merged decoder, or with ``#unmerged`` after its path
decoder_model.onnx then decoder_with_past_model.onnx), greedy-generates ``--new-tokens``
tokens for ``--prompts`` prompts of the task the models learnt, and prints one JSON object
per folder, in the order given (one process for all: loading torch and transformers is most
of the time): ``{"tokens": [[...], ...], "min_margin": m, "min_relative_margin": r,
"decoders": [files]}``. ``min_margin`` is the smallest gap between the best and the
second-best logit over every generated token, ``min_relative_margin`` that gap over the
largest |logit| of its step: how far the float32 choice is from flipping (float16 rounds at
about 5e-4 of a value, so a float16 run that picks the same tokens says more the closer to
that the margin is).

The weights start random (seed 0) and are trained for a few seconds on a synthetic task
(:func:`train`), so that greedy choices have margins like a trained model's: a comparison of
the tokens a float16 folder generates with the float32 folder's is then worth making.
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
    """A 2-layer model of width 64 with random weights (seed 0), trained (see :func:`train`),
    in eval mode."""
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
            dropout_rate=0.0,
            **ids,
        )
        return train(transformers.T5ForConditionalGeneration(config), seq2seq=True)
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
            dropout=0.0,
            attention_dropout=0.0,
            **ids,
        )
        return train(transformers.BartForConditionalGeneration(config), seq2seq=True)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=64,
            **ids,
        )
        return train(transformers.LlamaForCausalLM(config), seq2seq=False)
    raise SystemExit(f"optimum_models: unknown model {kind!r}: choose {SEQ2SEQ + CAUSAL}")


WORDS = VOCAB - len(SPECIAL)  # w0 .. w91, ids 4 .. 95
STEPS = 150


def counting(start, length: int):  # type: ignore[no-untyped-def]
    """The ids of the words after each of ``start`` (a tensor of ids): w5 -> w6, w7, ... (w91
    is followed by w0), ``length`` of them per start."""
    import torch

    first = start.reshape(-1, 1) - len(SPECIAL)
    return len(SPECIAL) + (first + torch.arange(1, length + 1)) % WORDS


def train(net, *, seq2seq: bool):  # type: ignore[no-untyped-def]
    """``net`` after STEPS steps of AdamW (seed 0) on a synthetic task: counting on from a
    word, the seq2seq models from a prompt that repeats it (``w5 w5 w5`` -> ``w6 w7 w8 ...``),
    the causal one from the words counted so far. At random initialisation a 2-layer model's
    top two logits lie within float16's rounding of each other somewhere in 64 greedy
    choices about half the time (so a comparison of generated tokens would be a coin toss);
    trained, its choices have margins like a trained model's (``generate`` reports them)."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    net.train()
    for _ in range(STEPS):
        start = torch.randint(len(SPECIAL), VOCAB, (32,))
        if seq2seq:
            prompt = start.reshape(-1, 1).repeat(1, 8)
            eos = torch.ones(32, 1, dtype=torch.long)
            labels = torch.cat([counting(start, 17), eos], dim=1)
            loss = net(input_ids=prompt, labels=labels).loss
        else:
            text = torch.cat([start.reshape(-1, 1), counting(start, 23)], dim=1)
            loss = net(input_ids=text, labels=text).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"optimum_models: trained {STEPS} steps, last loss {loss.item():.4f}", file=sys.stderr)
    return net.eval()


def save_checkpoint(kind: str, folder: Path) -> None:
    """The model and its tokenizer saved as a hub checkpoint is, for Optimum to export."""
    model(kind).save_pretrained(folder)
    tokenizer().save_pretrained(folder)


def export(kind: str, output: Path) -> None:
    """Export ``kind`` with its cache, as optimum-cli export onnx does, to ``output``."""
    from optimum.exporters.onnx import main_export

    task = "text2text-generation-with-past" if kind in SEQ2SEQ else "text-generation-with-past"
    with tempfile.TemporaryDirectory(prefix="optimum-checkpoint-") as checkpoint:
        save_checkpoint(kind, Path(checkpoint))
        main_export(checkpoint, output, task=task, device="cpu")
    for leftover in output.glob("*.py"):  # none expected; keep the folder as users get it
        leftover.unlink()


def prompts(count: int, length: int, *, seq2seq: bool) -> list[str]:
    """``count`` prompts of ``length`` words for the task :func:`train` taught, from words
    drawn with a fixed seed: a word repeated (seq2seq), or words counted on (causal)."""
    import random

    draw = random.Random(1)
    starts = [draw.randrange(WORDS) for _ in range(count)]
    step = 0 if seq2seq else 1
    return [" ".join(f"w{(start + step * i) % WORDS}" for i in range(length)) for start in starts]


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
        prompts(count, length, seq2seq=config.is_encoder_decoder),
        return_tensors="pt",
        padding=True,
        return_token_type_ids=False,
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
    margins, relative = [], []
    for scores in out.scores:  # scores of the suppressed tokens (eos before 16) are -inf
        top = scores.topk(2).values
        gap = top[:, 0] - top[:, 1]
        scale = scores.masked_fill(~scores.isfinite(), 0).abs().amax(dim=1)
        margins.append(float(gap.min()))
        relative.append(float((gap / scale).min()))
    return {
        "tokens": tokens,
        "min_margin": min(margins),
        "min_relative_margin": min(relative),
        "decoders": decoders,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    exporting = commands.add_parser("export", help="export a small model to a folder")
    exporting.add_argument("kind", choices=SEQ2SEQ + CAUSAL)
    exporting.add_argument("output", type=Path)
    saving = commands.add_parser("checkpoint", help="save a small model as a local checkpoint")
    saving.add_argument("kind", choices=SEQ2SEQ + CAUSAL)
    saving.add_argument("output", type=Path)
    generating = commands.add_parser("generate", help="greedy generation on exported folders")
    generating.add_argument("folders", nargs="+", metavar="FOLDER[#unmerged]")
    generating.add_argument("--prompts", type=int, default=4)
    generating.add_argument("--prompt-words", type=int, default=8)
    generating.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.command == "checkpoint":
        save_checkpoint(args.kind, args.output)
    elif args.command == "export":
        if args.output.exists() and any(args.output.iterdir()):
            raise SystemExit(f"optimum_models: {args.output} is not empty")
        export(args.kind, args.output)
        print(json.dumps(sorted(p.name for p in args.output.iterdir())))
    else:
        results = []
        for spec in args.folders:
            folder, _, mode = spec.partition("#")
            results.append(
                generate(
                    Path(folder),
                    count=args.prompts,
                    length=args.prompt_words,
                    new_tokens=args.new_tokens,
                    unmerged=mode == "unmerged",
                )
            )
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
