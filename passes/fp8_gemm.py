"""What CUDA's float8 GEMMs accept: a validator for the scaled matrix products graphamp emits.

A CPU runs ``torch._scaled_mm`` on far more than a GPU does (any dims, any layout, E5M2 x E5M2,
a bias with float32 output), so a graph that runs here may be refused on the GPU it is meant
for. Every float8 product a pass or a dialect emits is described as a :class:`ScaledGemm` and
checked here; the rules are PyTorch's checks in ``aten/src/ATen/native/cuda/Blas.cpp`` and
cuBLASLt's float8 requirements:

1. Not both operands E5M2 ("Multiplication of two Float8_e5m2 matrices is not supported").
2. The TN layout: A row-major (M x K, K contiguous), B column-major (K x N, K contiguous):
   cuBLASLt's float8 GEMM is TN only (inductor's lowering says "mat_b must be col_major").
3. K and N multiples of 16 (``mat1``'s columns and ``mat2``'s both dimensions; M is free).
4. No bias with a float32 output ("Bias is not supported when out_dtype is set to Float32").
5. Scales float32, both per tensor or both per row (A's (M, 1), B's (1, N)); other mixes
   are "Invalid scaling configuration".
6. 2-D operands (batch dimensions flattened into M before the product).
"""

from __future__ import annotations

from dataclasses import dataclass

FLOAT8_FORMATS = ("e4m3fn", "e5m2")
OUTPUT_TYPES = ("float32", "float16", "bfloat16", "e4m3fn")


@dataclass(frozen=True)
class ScaledGemm:
    """One float8 matrix product ``out = (A * scale_a) @ (B * scale_b) [+ bias]``."""

    a_format: str
    b_format: str
    m: int | None
    k: int | None
    n: int | None
    a_layout: str = "row"  # "row": K contiguous in A (row-major M x K)
    b_layout: str = "column"  # "column": K contiguous in B (column-major K x N)
    out_dtype: str = "bfloat16"
    bias: bool = False
    scale_dtype: str = "float32"
    a_granularity: str = "tensor"  # "tensor" or "row"
    b_granularity: str = "tensor"
    rank: int = 2  # the operands' rank as passed to the kernel


def problems(gemm: ScaledGemm) -> list[str]:
    """Why CUDA would refuse ``gemm``, one sentence each (empty when it accepts it)."""
    found: list[str] = []
    for which, fmt in (("A", gemm.a_format), ("B", gemm.b_format)):
        if fmt not in FLOAT8_FORMATS:
            found.append(f"operand {which} is {fmt}, not a float8 format (e4m3fn, e5m2)")
    if gemm.a_format == gemm.b_format == "e5m2":
        found.append("both operands are e5m2: CUDA multiplies e4m3fn x e4m3fn or mixes them")
    if gemm.a_layout != "row" or gemm.b_layout != "column":
        found.append(
            f"layout {gemm.a_layout}-major A x {gemm.b_layout}-major B: cuBLASLt's float8 GEMM "
            "needs row-major A and column-major B (TN)"
        )
    for dim, value in (("K", gemm.k), ("N", gemm.n)):
        if value is None:
            found.append(f"{dim} is unknown: CUDA needs it a multiple of 16")
        elif value % 16:
            found.append(f"{dim} = {value} is not a multiple of 16")
    if gemm.out_dtype not in OUTPUT_TYPES:
        writes = ", ".join(OUTPUT_TYPES)
        found.append(f"output type {gemm.out_dtype} is not one CUDA writes ({writes})")
    if gemm.bias and gemm.out_dtype == "float32":
        found.append("a bias with a float32 output: CUDA adds a bias only to a low-type output")
    if gemm.scale_dtype != "float32":
        found.append(f"scales are {gemm.scale_dtype}: CUDA takes float32 scales")
    if {gemm.a_granularity, gemm.b_granularity} - {"tensor", "row"} or (
        gemm.a_granularity != gemm.b_granularity
    ):
        found.append(
            f"scales per {gemm.a_granularity} (A) and per {gemm.b_granularity} (B): CUDA takes "
            "both per tensor or both per row"
        )
    if gemm.rank != 2:
        found.append(f"operands of rank {gemm.rank}: flatten the batch dimensions into M first")
    return found
