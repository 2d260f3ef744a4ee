"""Print the default op lists as the Markdown tables docs/policies.md shows.

    python tools/lists/lists_markdown.py > /tmp/lists.md

tests/test_readme.py checks that docs/policies.md holds exactly this output between its
``<!-- lists:start -->`` and ``<!-- lists:end -->`` markers.
"""

from __future__ import annotations

from graphamp.policy.policy import LISTS, load_default_lists


def lists_markdown() -> str:
    fp16 = load_default_lists("onnx", "float16")
    bf16 = load_default_lists("onnx", "bfloat16")
    lines = []
    for name in LISTS:
        lines += [f"**{name}**", "", "| op | reason and source | bfloat16 |", "|---|---|---|"]
        for op, reason in sorted(fp16[name].items()):
            moved = next((other for other in LISTS if op in bf16[other]), None)
            lines.append(f"| {op} | {reason} | {'same' if moved == name else moved} |")
        extra = sorted(set(bf16[name]) - set(fp16[name]))
        for op in extra:
            lines.append(
                f"| {op} | {bf16[name][op]} | {name} (float16: "
                f"{next(o for o in LISTS if op in fp16[o])}) |"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(lists_markdown(), end="")
