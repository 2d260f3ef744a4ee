"""The fused ops the ONNX dialect can write in place of a decomposed pattern.

A decomposed LayerNorm (``(x - mean(x)) / sqrt(var(x) + eps) * w + b``, what torch.onnx's
TorchScript exporter writes below opset 17) is replaced by ONNX ``LayerNormalization``
(``stash_type=1``) where the model's opset has it (17 and later), on any target.

A decomposed RMSNorm (``x * 1/sqrt(mean(x**2) + eps) * w``, what torch.onnx writes for
LLaMA, Mistral, Gemma, Phi-3 and T5 below opset 23) is replaced by ONNX ``RMSNormalization``
(``stash_type=1``, the mean of squares accumulated in float32) where the model's opset has it
(23 and later), on any target.

For ``--target cuda|cpu`` a norm whose input is a residual Add of two values of its shape
(a decoder's ``h = h + attention(...)`` before the next norm) becomes onnxruntime's
``SkipSimplifiedLayerNormalization`` (RMSNorm) or ``SkipLayerNormalization`` (LayerNorm) in
``com.microsoft``, at any opset: one kernel for the Add and the norm, the sum also written as
its fourth output where others read it. Those kernels take inputs of rank 2 or 3 only (they
check when they run, not when they load): a norm over a 4-D value keeps its ops there.

No op is written in ONNX's own domain below the opset that defines it: onnxruntime registers
``SimplifiedLayerNormalization`` (and ``LayerNormalization`` before 17) there and its
transformer optimizer writes them, but ``onnx.checker`` refuses a model holding them (no such
op in ONNX's domain at that opset), and every converted model passes the full check. Below
those opsets ``com.microsoft`` has no plain RMSNorm or LayerNorm that every onnxruntime
release loads, so for ``--target cuda|cpu`` a norm with no residual Add before it is the Skip
op reading the norm's input as both input and skip, epsilon x4 (``passes/fuse_norms.py``): the
kernel normalises 2x (exact in floating point, summed and accumulated in float32), and the
norm of 2x with 4 x epsilon is the norm of x. For ``--target any`` such a norm keeps its ops
(float32 statistics between one Cast pair).

The node is built with the slots, allowed types and kernel note the reader gives every node
(:func:`graphamp.onnx.dialect.slots.computing_node`), so classify decides it like any other.
"""

from __future__ import annotations

from graphamp.core.graph import FusedKernel, OpNode, TensorInfo
from graphamp.onnx.dialect import kernels, slots

RMS_NORM_OPSET = 23  # ONNX RMSNormalization
LAYER_NORM_OPSET = 17  # ONNX LayerNormalization


def fused_kernels(
    opsets: dict[str, int], target: str, provider: str, tensors: dict[str, TensorInfo]
) -> dict[str, FusedKernel]:
    """The fused ops available to a graph at ``opsets`` for ``provider`` (kernels.TARGETS)."""
    opset = opsets.get("", 0)
    found: dict[str, FusedKernel] = {}
    if opset >= RMS_NORM_OPSET:
        found["rms_norm"] = _kernel("RMSNormalization", opset, opsets, target, provider, tensors)
    if opset >= LAYER_NORM_OPSET:
        found["layer_norm"] = _kernel(
            "LayerNormalization", opset, opsets, target, provider, tensors
        )
    if provider in kernels.PROVIDERS:  # the residual Add and the norm in one kernel
        for kind, op in SKIP_NORMS.items():
            found[kind] = _kernel(
                op, opset, opsets, target, provider, tensors, RUNTIME_DOMAIN, SKIP_NORM_RANKS
            )
    return found


RUNTIME_DOMAIN = "com.microsoft"
SKIP_NORMS = {
    "skip_rms_norm": "SkipSimplifiedLayerNormalization",
    "skip_layer_norm": "SkipLayerNormalization",
}
# onnxruntime's Skip norms check their input's rank when they run, not when they load ("input
# is expected to have 3 or 2 dimensions", CPU and CUDA alike): a per-head norm over
# [batch, sequence, heads, head_dim] (Qwen3's and Gemma-3's q_norm and k_norm) is not theirs
SKIP_NORM_RANKS = (2, 3)


def _kernel(
    op: str,
    opset: int,
    opsets: dict[str, int],
    target: str,
    provider: str,
    tensors: dict[str, TensorInfo],
    domain: str = "",
    ranks: tuple[int, ...] | None = None,
) -> FusedKernel:
    signatures: dict[tuple[object, ...], slots.Slots] = {}

    def build(name: str, inputs: list[str], outputs: list[str]) -> OpNode:
        node = OpNode(
            name=name,
            op=slots.op_name(op, domain),
            inputs=list(inputs),
            outputs=list(outputs),
            domain=domain,
            scope=name,
            schema_source=f"opset {slots.opset_of(opsets, domain)}",
        )
        output_types = tuple(tensors[out].dtype if out else "" for out in outputs)
        slots.computing_node(
            node, op, tensors, output_types, opsets, target, signatures, _attribute
        )
        version = slots.opset_of(opsets, domain) if not domain else 1
        node.no_kernel = kernels.missing_kernel(provider, domain, op, version, target)
        return node

    return FusedKernel(op=op, domain=domain, build=build, ranks=ranks)


def _attribute(name: str) -> object:
    return {"axis": -1, "stash_type": 1}.get(name)
