"""Which low types onnxruntime's execution providers have kernels for.

An op converted to float16 that the target provider has no float16 kernel for does not fail:
onnxruntime places it on the CPU provider, with copies to and from the GPU around it (or, on
the CPU, runs a float32 kernel between Casts it inserts itself). Either is slower than keeping
the op float32, so such an op stays float32 with rule ``no_kernel``.

The table (``graphamp/lists/onnxruntime_kernels.tsv``) is transcribed from onnxruntime's
``docs/OperatorKernels.md``, which onnxruntime generates from its kernel registrations; its
first line names the commit. One row per provider, domain, op and opset range, with a 1 or 0
for float16, bfloat16 and float32 appearing among the kernel's types.
``tools/lists/kernel_table.py`` turns a copy of ``OperatorKernels.md`` into this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

PROVIDERS = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
TARGETS = ("cuda", "cpu", "any")  # "any": no kernel check (another runtime, or a reference)
TABLE = "onnxruntime_kernels.tsv"
_COLUMNS = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class KernelRow:
    since: int
    until: int  # 0: open-ended
    types: frozenset[str]

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until == 0 or opset <= self.until)


@cache
def _table() -> tuple[str, dict[tuple[str, str, str], tuple[KernelRow, ...]]]:
    text = resources.files("graphamp.lists").joinpath(TABLE).read_text(encoding="utf-8")
    source = ""
    rows: dict[tuple[str, str, str], list[KernelRow]] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            source = source or line.lstrip("# ").strip()
            continue
        fields = line.split("\t")
        if len(fields) != 8 or fields[0] == "provider":
            continue
        provider, domain, op, since, until, *flags = fields
        types = frozenset(t for t, flag in zip(_COLUMNS, flags, strict=True) if flag == "1")
        rows.setdefault((provider, domain, op), []).append(KernelRow(int(since), int(until), types))
    return source, {key: tuple(value) for key, value in rows.items()}


def table_source() -> str:
    """Where the table comes from (onnxruntime's document and commit)."""
    return _table()[0]


@cache  # pure; read for every node of a large graph
def missing_kernel(target: str, domain: str, op: str, opset: int, dtype: str) -> str:
    """Why ``target`` runs ``domain::op`` at ``opset`` in ``dtype`` on no kernel of its own,
    or "" when it has one, when it registers the op for no float type at all (the op is
    expanded or placed elsewhere in float32 too, so keeping it float32 gains nothing), or
    when ``target`` is "any"."""
    if target not in PROVIDERS:
        return ""
    domain = domain or "ai.onnx"
    rows = _table()[1].get((target, domain, op), ())
    current = [row for row in rows if row.covers(opset)]
    if not current or "float32" not in current[0].types or dtype in current[0].types:
        return ""
    return (
        f"onnxruntime's {PROVIDERS[target]} has no {dtype} kernel for {op} at opset {opset}, "
        f"only {', '.join(sorted(current[0].types))} (its OperatorKernels.md): a {dtype} node "
        "would fall back to another provider with copies around it"
    )
