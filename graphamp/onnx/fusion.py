"""The fused ops the ONNX dialect can write in place of a decomposed pattern.

A decomposed LayerNorm (``(x - mean(x)) / sqrt(var(x) + eps) * w + b``, what torch.onnx's
TorchScript exporter writes below opset 17) is replaced by ``LayerNormalization``
(``stash_type=1``): ONNX's from opset 17 on any target, onnxruntime's own registration of it
in ONNX's domain below that for ``--target cuda`` or ``cpu``.

A decomposed RMSNorm (``x * 1/sqrt(mean(x**2) + eps) * w``, what torch.onnx writes for
LLaMA, Mistral, Gemma, Phi-3 and T5 below opset 23) is replaced by a single op whose kernel
accumulates the mean of squares in float32 (``stash_type=1``), so it takes low inputs and
outputs with no Cast where the decomposed ops would need float32 statistics:

* ONNX ``RMSNormalization`` where the model's opset has it (23 and later), on any target;
* onnxruntime's ``SimplifiedLayerNormalization`` (registered in ONNX's own domain, written by
  its transformer optimizer) below that, for ``--target cuda`` or ``cpu``;
* nothing for ``--target any`` below opset 23: no other runtime is known to have the op.

For ``--target cuda|cpu`` a norm whose input is a residual Add of two values of its shape
(a decoder's ``h = h + attention(...)`` before the next norm) becomes onnxruntime's
``SkipSimplifiedLayerNormalization`` (RMSNorm) or ``SkipLayerNormalization`` (LayerNorm) in
``com.microsoft``: one kernel for the Add and the norm, the sum also written as its fourth
output where others read it.

The node is built with the slots, allowed types and kernel note the reader gives every node
(:func:`graphamp.onnx.slots.computing_node`), so classify decides it like any other.
"""

from __future__ import annotations

from graphamp.graph import FusedKernel, OpNode, TensorInfo
from graphamp.onnx import kernels, slots

RMS_NORM_OPSET = 23  # ONNX RMSNormalization
LAYER_NORM_OPSET = 17  # ONNX LayerNormalization


def fused_kernels(
    opsets: dict[str, int], target: str, provider: str, tensors: dict[str, TensorInfo]
) -> dict[str, FusedKernel]:
    """The fused ops available to a graph at ``opsets`` for ``provider`` (kernels.TARGETS)."""
    opset = opsets.get("", 0)
    runtime = provider in kernels.PROVIDERS
    found: dict[str, FusedKernel] = {}
    if opset >= RMS_NORM_OPSET:
        found["rms_norm"] = _kernel("RMSNormalization", opset, opsets, target, provider, tensors)
    elif runtime:
        found["rms_norm"] = _kernel(
            "SimplifiedLayerNormalization", opset, opsets, target, provider, tensors
        )
    if opset >= LAYER_NORM_OPSET or runtime:  # below 17: onnxruntime's own registration
        found["layer_norm"] = _kernel(
            "LayerNormalization", opset, opsets, target, provider, tensors
        )
    if runtime:  # the residual Add and the norm in one kernel, onnxruntime's own
        for kind, op in SKIP_NORMS.items():
            found[kind] = _kernel(op, opset, opsets, target, provider, tensors, RUNTIME_DOMAIN)
    return found


RUNTIME_DOMAIN = "com.microsoft"
SKIP_NORMS = {
    "skip_rms_norm": "SkipSimplifiedLayerNormalization",
    "skip_layer_norm": "SkipLayerNormalization",
}


def _kernel(
    op: str,
    opset: int,
    opsets: dict[str, int],
    target: str,
    provider: str,
    tensors: dict[str, TensorInfo],
    domain: str = "",
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

    return FusedKernel(op=op, domain=domain, build=build)


def _attribute(name: str) -> object:
    return {"axis": -1, "stash_type": 1}.get(name)
