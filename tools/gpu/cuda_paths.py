"""The eager step's CUDA-only passes, run on a GPU against the same step without them.

    python tools/gpu/cuda_paths.py [--steps 6]

An eager ``graphamp.fx.train_step`` on a CUDA device takes passes a CPU never runs, or runs
only on its own kernels (:func:`graphamp.fx.training.eager.for_eager`): ``softmax_casts.fused``
(CUDA's float16 -> float32 softmax kernels, ``_softmax(half_to_float=True)`` and its backward
writing float16), ``in_place.guards_read_once`` (the finite check read on the host once, the
guards then in place) and the row-wise backwards written into their incoming gradient
(``in_place.in_place``'s ``into_first_on``: the masked-LM loss's log-softmax backward).
Tests cannot run them (no GPU); this script trains gpu_train.py's tiny Hugging Face BERT
(HF's eager attention, dropout on, AdamW, float16 with dynamic loss scaling whose first step
overflows and is skipped) for ``--steps`` steps twice from the same seed, with the passes and
with ``eager.on_cuda`` answering False (the step as before them), and prints what each graph
holds and how far the losses, the weights, the loss scale and the skipped steps differ; where
no softmax was fused, what the captured model's softmax reads. Exit status 1 when a pass did
not run or the two runs differ by more than 1e-3 (the fused kernels and the casts compute the
same float32 values, and a backward writes the same values into its gradient as into a new
tensor: bit for bit is expected, and said).
"""

from __future__ import annotations

import argparse
import logging
import sys

import gpu_train  # tools/gpu, beside this script
import torch


def small_bert() -> gpu_train.Workload:
    """gpu_train.py's tiny BERT (HF's eager attention, dropout, AdamW), at the batch and
    sequence this check runs: 8 x 64."""
    return gpu_train.workload("bert-base", "tiny", batch=8, seq=64)


def trained(device: torch.device, steps: int, cuda_passes: bool) -> dict:
    """``steps`` steps of the small BERT; its losses, weights, scale, skips and graph."""
    import graphamp
    from graphamp.fx import train_step
    from graphamp.fx.dialect import lowering
    from graphamp.fx.training import eager, in_place

    work = small_bert()
    model = work.build(0).to(device).train()
    step = train_step(
        model,
        work.loss_fn,
        work.optimizer(model),
        dtype="float16",
        # the first step overflows (2**30 times the loss), is skipped, and the scale drops
        # to 2**16, GradScaler's start
        loss_scaling=graphamp.DynamicLossScaling(
            init_loss_scaling=2.0**30,
            incr_every_n_steps=2000,
            decr_every_n_nan_or_inf=1,
            decr_ratio=2.0**-14,
            min_loss_scaling=0.0,
        ),
    )
    batches = [work.batch(seed, device) for seed in range(steps)]
    saved = eager.on_cuda
    if not cuda_passes:
        eager.on_cuda = lambda module: False
    try:
        torch.manual_seed(2)  # the same dropout masks in both runs
        losses = [float(step(*batch)) for batch in batches]
    finally:
        eager.on_cuda = saved
    captured = step._graphs[step._signature].captured["update"]
    nodes = list(captured.module.graph.nodes)
    return {
        "losses": losses,
        "weights": [p.detach().clone() for p in step.model.parameters()],
        "scale": float(step.loss_scale),
        "skipped": int(step.skipped_steps),
        "host reads": sum(n.target is lowering.read_on_host for n in nodes),
        "fused softmaxes": sum(
            n.target is torch.ops.aten._softmax.default and n.args[2] is True for n in nodes
        ),
        "backwards into their gradient": sum(in_place.written_into_first(n) for n in nodes),
    }


def softmax_inputs(device: torch.device, depth: int = 4) -> list[str]:
    """The small BERT captured on ``device`` as its training step captures it (static shapes;
    :func:`graphamp.fx.dialect.capture.capture`, where masks that mask nothing are dropped):
    each mask the check judged and its verdict, its debug lines (an op it could not
    evaluate), then what the first softmax reads, ``depth`` nodes up. Where the softmax pass
    finds nothing to fuse, this shows what stands between (a mask added to the scores that
    the capture could not prove all zero, say)."""
    from graphamp.fx.dialect import attention
    from graphamp.fx.dialect.capture import capture

    work = small_bert()
    model = work.build(0).to(device).eval()
    ids = work.batch(0, device)[0]  # the step's batch, static as the step captures it
    lines: list[str] = []
    verdicts = attention._masks_nothing

    def traced_verdict(mask: torch.fx.Node) -> bool:  # each mask the check judges, and how
        verdict = verdicts(mask)
        lines.append(f"mask check: {mask.format_node()} -> masks nothing: {verdict}")
        return verdict

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger, handler = logging.getLogger("graphamp"), Lines()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    attention._masks_nothing = traced_verdict
    try:
        module = capture(model, (ids,), dynamic_shapes="static")
    finally:
        attention._masks_nothing = verdicts
        logger.removeHandler(handler)
        logger.setLevel(level)

    def show(node: object, level: int) -> None:
        if not isinstance(node, torch.fx.Node) or level > depth:
            return
        lines.append("  " * level + node.format_node())
        for parent in node.all_input_nodes:
            show(parent, level + 1)

    for node in module.graph.nodes:
        if node.target in (torch.ops.aten.softmax.int, torch.ops.aten._softmax.default):
            show(node, 0)
            break  # every layer's is alike
    return lines + literals(module)


def literals(module: torch.fx.GraphModule) -> list[str]:
    """Each tensor literal the captured graph still holds (a ``get_attr`` that
    ``lift_fresh_copy`` reads: transformers 5.17 writes its mask's zero so) as the mask check
    reads it: the attribute's type, device and constant, and the value the check gets, or
    None where it refuses it (the check logs nothing then)."""
    from torch._subclasses.fake_tensor import is_fake

    from graphamp.fx.dialect import attention
    from graphamp.fx.dialect.ops import attribute_of

    lines = []
    for node in module.graph.nodes:
        if node.op != "get_attr" or not any(
            reader.target is torch.ops.aten.lift_fresh_copy.default for reader in node.users
        ):
            continue
        try:
            value = attribute_of(module, node)
        except AttributeError as error:
            lines.append(f"literal {node.target}: no attribute ({error})")
            continue
        held = (
            f"{type(value).__name__} {value.dtype} {tuple(value.shape)} on {value.device}, "
            f"fake {is_fake(value)}, constant {getattr(value, 'constant', None)!r}"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        readers = ", ".join(reader.format_node() for reader in node.users)
        lines.append(
            f"literal {node.target}: {held}; the check reads {attention._literal(node)!r}; "
            f"read by {readers}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=6, help="training steps per run")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_paths: torch sees no CUDA device; these passes run on CUDA steps only")
        return 2
    device = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    new = trained(device, args.steps, cuda_passes=True)
    old = trained(device, args.steps, cuda_passes=False)
    for key in (
        "host reads",
        "fused softmaxes",
        "backwards into their gradient",
        "skipped",
        "scale",
    ):
        print(f"{key}: with the CUDA passes {new[key]}, without {old[key]}")
    print("losses with:   ", " ".join(f"{x:.6f}" for x in new["losses"]))
    print("losses without:", " ".join(f"{x:.6f}" for x in old["losses"]))
    loss_diff = max(abs(a - b) for a, b in zip(new["losses"], old["losses"], strict=True))
    weight_diff = max(
        float((a.float() - b.float()).abs().max())
        for a, b in zip(new["weights"], old["weights"], strict=True)
    )
    identical = loss_diff == 0 and weight_diff == 0
    print(f"max loss difference {loss_diff:.3e}; max weight difference {weight_diff:.3e}")
    print("bit for bit" if identical else "NOT bit for bit (see the differences above)")
    ran = (
        new["host reads"] == 1
        and new["fused softmaxes"] > 0
        and new["backwards into their gradient"] > 0  # the masked-LM loss's log-softmax
        and old["host reads"] == 0
        and old["backwards into their gradient"] == 0
    )
    print("the passes ran" if ran else "a CUDA pass did not run")
    if not new["fused softmaxes"]:
        print("no softmax fused; the first softmax of the captured model reads:")
        print("\n".join(softmax_inputs(device)))
    same = new["skipped"] == old["skipped"] and new["scale"] == old["scale"]
    return 0 if ran and same and loss_diff < 1e-3 and weight_diff < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
