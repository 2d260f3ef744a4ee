"""Attention masks that mask nothing are dropped from captured graphs, and only those."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import graphamp.fx as gfx
from graphamp.fx.dialect.attention import drop_all_true_masks
from graphamp.fx.dialect.capture import capture
from tests.hf_models import VOCAB, hf_model

SDPA = torch.ops.aten.scaled_dot_product_attention.default
WHERES = (torch.ops.aten.where.self, torch.ops.aten.where.ScalarOther)


class Attention(nn.Module):
    """Self-attention whose mask ``make_mask(x)`` builds; ``x`` is [batch, heads, n, 16]."""

    def __init__(self, make_mask):
        super().__init__()
        self.make_mask = make_mask
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x)
        return F.scaled_dot_product_attention(q, x, x, attn_mask=self.make_mask(x))


def padding_style(x: torch.Tensor) -> torch.Tensor:
    """As transformers builds a mask with no padding while traced: positions >= 0."""
    n = x.shape[2]
    return (torch.arange(n) + 0 >= 0)[None, None, None, :].expand(x.shape[0], 1, n, n)


def masks_read(module: torch.fx.GraphModule) -> list[object]:
    nodes = [n for n in module.graph.nodes if n.target is SDPA]
    assert nodes, "the graph holds no attention"
    return [n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None) for n in nodes]


def written_after(x: torch.Tensor) -> torch.Tensor:
    """All true as built, then one row written in place (a ``fill_`` of a slice)."""
    mask = torch.ones(x.shape[2], x.shape[2], dtype=torch.bool)
    mask[0, 1:] = False
    return mask


def x_of(batch: int = 2, n: int = 8) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(batch, 2, n, 16)


@pytest.mark.parametrize(
    "make_mask",
    [
        padding_style,
        lambda x: torch.ones(x.shape[2], x.shape[2], dtype=torch.bool),
        lambda x: torch.zeros(1, 1, x.shape[2], x.shape[2]),  # an additive mask of zeros
        lambda x: torch.full((x.shape[2],), True).unsqueeze(0).transpose(0, 1),
    ],
    ids=["arange", "ones", "float-zeros", "transposed"],
)
def test_a_constant_mask_that_masks_nothing_is_dropped_and_the_output_kept(make_mask):
    model, x = Attention(make_mask).eval(), x_of()
    module = capture(model, (x,))
    assert masks_read(module) == [None]
    assert not [n for n in module.graph.nodes if n.target is torch.ops.aten.arange.default]
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(module(x_of(batch=5)), model(x_of(batch=5)))  # any batch


@pytest.mark.parametrize(
    "make_mask",
    [
        lambda x: torch.ones(x.shape[2], x.shape[2], dtype=torch.bool).tril(),  # causal
        lambda x: (torch.arange(x.shape[2]) < x.shape[2] - 1).expand(x.shape[2], -1),  # one masked
        lambda x: torch.full((x.shape[2], x.shape[2]), -1.0),  # adds to every score: not nothing
        lambda x: x[:, :1, :, :1] > -100.0,  # from the input: values unknown when traced
        lambda x: torch.rand(x.shape[2], x.shape[2]) >= 0.0,  # all true, but drawn: not a constant
        written_after,
    ],
    ids=["causal", "one-masked", "float-nonzero", "from-input", "random", "written-after"],
)
def test_a_mask_that_masks_something_or_is_not_constant_is_kept(make_mask):
    model, x = Attention(make_mask).eval(), x_of()
    module = capture(model, (x,))
    assert all(isinstance(mask, torch.fx.Node) for mask in masks_read(module))
    assert drop_all_true_masks(module) == []
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x))


def test_a_mask_this_check_cannot_evaluate_is_kept_and_the_capture_goes_on(caplog):
    caplog.set_level(logging.DEBUG, logger="graphamp")
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    eye = graph.call_function(torch.ops.aten.eye.default, (4,), {"dtype": torch.bool})
    failing = graph.call_function(torch.ops.aten.cholesky.default, (eye,))  # not for booleans
    eye.meta["val"] = failing.meta["val"] = torch.ones(4, 4, dtype=torch.bool)
    graph.output(graph.call_function(SDPA, (x, x, x, failing)))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert drop_all_true_masks(module) == []
    assert masks_read(module) == [failing]
    assert f"mask check: {failing.name} not evaluated" in caplog.text  # why it is kept, at debug


def test_hugging_face_bert_without_padding_attends_without_a_mask_with_padding_with_one():
    model = hf_model("bert")
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 12))
    unpadded, _ = gfx.convert(model, (ids,), dtype="bfloat16")
    assert masks_read(unpadded) == [None, None]
    padding = torch.ones(2, 12, dtype=torch.long)
    padding[1, 9:] = 0
    padded, _ = gfx.convert(
        model, (ids,), example_kwargs={"attention_mask": padding}, dtype="bfloat16"
    )
    assert all(isinstance(mask, torch.fx.Node) for mask in masks_read(padded))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        reference = model(ids).last_hidden_state
    ours = unpadded(ids).last_hidden_state
    assert (ours - reference).abs().max() <= 2e-2 * reference.abs().max()


def test_the_compile_backend_drops_such_masks_too():
    model = Attention(padding_style)
    backend = gfx.backend(dtype="bfloat16", inner="aot_eager")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = x_of()
    output = compiled(x)
    (plan,) = backend.plans
    assert not [name for name in plan.nodes if "arange" in name or name.endswith("/ge")]
    assert any(name.endswith("scaled_dot_product_attention") for name in plan.nodes)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = model(x)
    torch.testing.assert_close(output, reference, rtol=2e-2, atol=2e-2)


class AddedMask(nn.Module):
    """Attention as transformers' "eager" implementation computes it: scores, ``make_mask(x)``
    added, softmax (then ``reader`` of the sum, the softmax by default)."""

    def __init__(self, make_mask, reader=None):
        super().__init__()
        self.make_mask, self.reader = make_mask, reader
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.proj(x) @ x.transpose(-1, -2) * 0.25
        total = scores + self.make_mask(x)
        if self.reader is not None:
            return self.reader(total)
        return torch.softmax(total, dim=-1) @ x


def adds(module: torch.fx.GraphModule) -> int:
    return sum(n.target is torch.ops.aten.add.Tensor for n in module.graph.nodes)


def float_padding(x: torch.Tensor) -> torch.Tensor:
    """transformers' float mask, traced (5.24): where(keep, zeros(()), min)."""
    keep = padding_style(x)  # expanded to the (symbolic) batch
    return torch.where(keep, torch.zeros(()), torch.full((), torch.finfo(x.dtype).min))


def literal_padding(x: torch.Tensor, zero: float = 0.0) -> torch.Tensor:
    """transformers 5.17's: where(keep, torch.tensor(0.0), min), a tensor literal, which the
    trace keeps as an attribute copied by ``lift_fresh_copy`` (and ``detach_``-ed)."""
    return torch.where(padding_style(x), torch.tensor(zero), torch.finfo(x.dtype).min)


class Wrapped(nn.Module):
    """``inner`` as a submodule: its literals are traced as ``inner.lifted_tensor_0``."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


@pytest.mark.parametrize(
    "model",
    [
        lambda: AddedMask(float_padding),
        lambda: AddedMask(literal_padding),
        lambda: Wrapped(AddedMask(literal_padding)),
    ],
    ids=["zeros", "tensor-literal", "literal-in-submodule"],
)
def test_a_zero_mask_added_to_scores_only_a_softmax_reads_is_dropped_with_the_same_values(model):
    model, x = model().eval(), x_of()
    x[0, 0, 0, :] = 0.0  # scores of -0.0 and +0.0, which the add would make +0.0
    x[0, 0, 1, :] = -0.0
    module = capture(model, (x,))
    assert adds(module) == 0  # the linear's bias is in addmm; the mask's add is gone
    assert not [n for n in module.graph.nodes if n.target in WHERES]
    assert not [n for n in module.graph.nodes if "lifted_tensor" in str(n.target)]  # its 0.0
    with torch.no_grad():
        assert torch.equal(module(x), model(x))
        assert torch.equal(module(x_of(batch=5)), model(x_of(batch=5)))


@pytest.mark.parametrize(
    "make_mask, reader",
    [
        (lambda x: torch.zeros(1, 1, x.shape[2], x.shape[2]), lambda total: total.sign()),
        (lambda x: torch.full((x.shape[2], x.shape[2]), -1.0), None),  # adds: not nothing
        (lambda x: torch.zeros(3, 1, 1, x.shape[2], x.shape[2]), None),  # widens the scores
        (
            lambda x: torch.where(
                torch.ones(x.shape[2], x.shape[2], dtype=torch.bool).tril(),
                torch.zeros(()),
                torch.full((), -1e9),
            ),
            None,
        ),  # causal, as transformers writes a float mask
        (lambda x: literal_padding(x, zero=-1.0), None),  # a literal that is not zero
        (lambda x: torch.where(padding_style(x), torch.tensor(0.0).add_(1.0), -1e9), None),
    ],
    ids=[
        "read-by-sign",
        "float-nonzero",
        "broadcast-wider",
        "float-causal",
        "literal-nonzero",
        "literal-written",
    ],
)
def test_an_added_mask_that_changes_something_or_is_read_otherwise_is_kept(make_mask, reader):
    model, x = AddedMask(make_mask, reader).eval(), x_of()
    module = capture(model, (x,))
    # the mask's add to the scores (padding_style's arange + 0 is an add too)
    score_adds = [
        n
        for n in module.graph.nodes
        if n.target is torch.ops.aten.add.Tensor and n.meta["val"].shape[-3:] == (2, 8, 8)
    ]
    assert len(score_adds) == 1
    with torch.no_grad():
        assert torch.equal(module(x), model(x))


def test_hugging_face_bert_eager_attention_adds_no_mask_of_zeros():
    model = hf_model("bert")
    model.config._attn_implementation = "eager"
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 12))
    module = capture(model, (ids,))
    softmaxes = [n for n in module.graph.nodes if n.target is torch.ops.aten.softmax.int]
    assert len(softmaxes) == 2 and all(
        s.args[0].target is not torch.ops.aten.add.Tensor for s in softmaxes
    )
    with torch.no_grad():
        torch.testing.assert_close(
            module(ids).last_hidden_state, model(ids).last_hidden_state, rtol=1e-5, atol=1e-5
        )


def test_a_mask_of_zeros_read_from_a_buffer_is_kept():
    """A buffer is state (a loaded checkpoint may change it), not a literal of the code."""

    class BufferMask(AddedMask):
        def __init__(self):
            super().__init__(lambda x: torch.where(padding_style(x), self.zero, -1e9))
            self.register_buffer("zero", torch.zeros(()))

    model, x = BufferMask().eval(), x_of()
    module = capture(model, (x,))
    assert [n for n in module.graph.nodes if n.target in WHERES]
    with torch.no_grad():
        assert torch.equal(module(x), model(x))


def test_a_literal_traced_as_a_fake_tensor_is_read_from_its_constant():
    """Traced under a fake mode, ``torch.tensor(0.0)`` is a fake tensor that keeps its real
    value as ``constant``: that value is the literal's; a fake without one is not known."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from graphamp.fx.dialect.attention import _literal

    with FakeTensorMode():
        literal, unknown = torch.tensor(0.0), torch.empty(())
    for value, expected in ((literal, torch.tensor(0.0)), (unknown, None)):
        root, graph = torch.nn.Module(), torch.fx.Graph()
        root.lit = value
        node = graph.get_attr("lit")
        copied = graph.call_function(torch.ops.aten.lift_fresh_copy.default, (node,))
        graph.output(copied)
        torch.fx.GraphModule(root, graph)  # the graph's owning module
        found = _literal(node)
        assert found is None if expected is None else torch.equal(found, expected)
