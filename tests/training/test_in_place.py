"""graphamp.fx.training.in_place: which elementwise ops of a step graph write into their first
operand, and that the values stay those of the functional graph."""

from __future__ import annotations

import functools
import operator

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.fx.dialect.lowering import (
    any_non_finite,
    non_finite,
    select_on_host,
    unscale_and_check,
)
from graphamp.fx.training import eager, in_place


def traced(fn, *examples: torch.Tensor) -> fx.GraphModule:  # type: ignore[no-untyped-def]
    return make_fx(fn)(*examples)


def made_in_place(module: fx.GraphModule) -> set[str]:
    """The nodes in_place changed, by the op they compute."""
    in_place.in_place(module)
    return {
        f"{n.meta['graphamp_functional'].__name__}:{n.name}"
        for n in module.graph.nodes
        if "graphamp_functional" in n.meta
    }


def test_only_buffers_of_the_graph_that_nothing_reads_later_are_written():
    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x * 2.0  # a new buffer
        b = a + 1.0  # a is read later (by sum): not written here
        c = a.sum()
        d = b * 3.0  # b is read by nothing else: written
        e = x + y  # x is a placeholder: never written
        f = e.view(-1)  # a view of e is alive...
        g = e * 2.0  # ...so e is not written
        h = a[0] + y  # a broadcast into a smaller tensor: not written
        return d, c, f, g, h

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    module = traced(step, x, y)
    expected = module(x.clone(), y.clone())
    changed = made_in_place(module)
    assert changed == {"mul.Tensor:mul_1"}, changed
    x_before, y_before = x.clone(), y.clone()
    got = module(x, y)
    assert torch.equal(x, x_before) and torch.equal(y, y_before)
    for want, have in zip(expected, got, strict=True):
        assert torch.equal(want, have)


def test_a_buffer_passes_on_through_a_chain_and_no_type_is_narrowed():
    def step(x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x.to(torch.float64)
        b = a * 0.5  # written into a
        c = b + 1.0  # written into a again: b passed its buffer on
        counts = n + 1  # n is a placeholder: a new buffer
        doubled = counts * 2  # written into counts
        widened = doubled / 3  # int64 divided: a float result, not written into doubled
        return c, widened

    x, n = torch.randn(5), torch.arange(5)
    module = traced(step, x, n)
    changed = made_in_place(module)
    assert changed == {"mul.Tensor:mul", "add.Tensor:add", "mul.Tensor:mul_1"}, changed
    c, widened = module(x, n)
    assert torch.equal(c, x.double() * 0.5 + 1.0)
    assert torch.equal(widened, (n + 1) * 2 / 3)


def guarded_graph() -> fx.GraphModule:
    """A step guard keeping or updating a parameter: new = p - lr * g."""
    graph = fx.Graph()
    found_inf, param, grad = (graph.placeholder(name) for name in ("found_inf", "p", "g"))
    lr = graph.placeholder("lr")
    new = graph.call_function(torch.ops.aten.addcmul.default, (param, grad, lr), {"value": -1})
    select = graph.call_function(select_on_host, (found_inf, param, new))
    graph.output(graph.call_function(operator.getitem, (select, 0)))
    for node, value in zip(
        (found_inf, param, grad, lr, new),
        (torch.tensor(False), torch.ones(4), torch.ones(4), torch.tensor(0.5), torch.ones(4)),
        strict=True,
    ):
        node.meta["val"] = value
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_kept_parameter_is_updated_in_place_only_when_the_step_is_taken():
    module = guarded_graph()
    assert in_place.guarded_updates(module) == 1
    grad, lr = torch.full((4,), 2.0), torch.tensor(0.5)
    param = torch.ones(4)
    kept = module(torch.tensor(True), param, grad, lr)
    assert kept is param and torch.equal(param, torch.ones(4))  # skipped: untouched
    taken = module(torch.tensor(False), param, grad, lr)
    assert taken is param and torch.equal(param, torch.zeros(4))  # 1 - 0.5 * 2, in place
    # torch.compile gets the functional graph back: new tensors, the parameter untouched
    in_place.functional(module)
    param = torch.ones(4)
    taken = module(torch.tensor(False), param, grad, lr)
    assert taken is not param and torch.equal(taken, torch.zeros(4))
    assert torch.equal(param, torch.ones(4))


def test_an_update_read_by_more_than_the_guard_stays_out_of_place():
    module = guarded_graph()
    graph = module.graph
    new = next(n for n in graph.nodes if n.target is torch.ops.aten.addcmul.default)
    output = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(output):
        also = graph.call_function(torch.ops.aten.sum.default, (new,))
    output.args = ((output.args[0], also),)
    module.recompile()
    assert in_place.guarded_updates(module) == 0


def momentum_graph(found_inf_first: bool, buffer_read_out: bool = False) -> fx.GraphModule:
    """SGD with momentum under a step guard: new_b = b * 0.9 + g, new_p = p - lr * new_b; the
    finite check before the updates (``found_inf_first``) or computed from ``g`` after the
    buffer's first op; with ``buffer_read_out`` the new buffer is also an output of its own."""
    graph = fx.Graph()
    flag, buffer, param, grad = (graph.placeholder(name) for name in ("flag", "b", "p", "g"))
    lr = graph.placeholder("lr")
    aten = torch.ops.aten
    found_inf = graph.call_function(aten.logical_or.default, (flag, flag))
    if not found_inf_first:
        found_inf.prepend(graph.call_function(aten.mul.Tensor, (buffer, 0.9)))
        kept = found_inf.prev
    else:
        kept = graph.call_function(aten.mul.Tensor, (buffer, 0.9))
    new_buffer = graph.call_function(aten.add.Tensor, (kept, grad))
    new_param = graph.call_function(aten.addcmul.default, (param, new_buffer, lr), {"value": -1})
    select = graph.call_function(select_on_host, (found_inf, buffer, new_buffer, param, new_param))
    outputs = [graph.call_function(operator.getitem, (select, i)) for i in (0, 1)]
    if buffer_read_out:
        outputs.append(graph.call_function(aten.clone.default, (new_buffer,)))
    graph.output(tuple(outputs))
    for node in (buffer, param, grad, kept, new_buffer, new_param):
        node.meta["val"] = torch.empty(4)
    flag.meta["val"] = found_inf.meta["val"] = torch.tensor(False)
    lr.meta["val"] = torch.tensor(0.5)
    return fx.GraphModule(torch.nn.Module(), graph)


def momentum_arguments(skipped: bool) -> tuple[torch.Tensor, ...]:
    return (
        torch.tensor(skipped),
        torch.full((4,), 2.0),
        torch.ones(4),
        torch.arange(4.0),
        torch.tensor(0.5),
    )


def test_an_update_chain_writes_into_its_state_only_when_the_step_is_taken():
    """The momentum buffer's mul-then-add and the parameter's addcmul, each an update chain
    the guard alone keeps: written in place when taken, left alone when skipped, with the
    functional graph's values either way."""
    module = momentum_graph(found_inf_first=True)
    expected = {s: module(*momentum_arguments(s)) for s in (False, True)}
    assert in_place.guarded_updates(module) == 2
    updates = [n for n in module.graph.nodes if n.target is in_place.update_unless]
    assert [n.args[2].__name__ for n in updates] == ["mul.Tensor", "add.Tensor", "addcmul.default"]
    for skipped in (False, True):
        arguments = momentum_arguments(skipped)
        before = [a.clone() for a in arguments]
        buffer, param = module(*arguments)
        assert buffer is arguments[1] and param is arguments[2], skipped  # no new tensor
        for want, have in zip(expected[skipped], (buffer, param), strict=True):
            assert torch.equal(want, have), skipped
        if skipped:
            assert all(torch.equal(a, b) for a, b in zip(arguments, before, strict=True))


def test_a_chain_read_past_the_guard_or_before_the_check_stays_out_of_place():
    # the new buffer also an output: its chain stays functional, the parameter's does not
    module = momentum_graph(found_inf_first=True, buffer_read_out=True)
    expected = module(*momentum_arguments(False))
    assert in_place.guarded_updates(module) == 1
    updates = [n for n in module.graph.nodes if n.target is in_place.update_unless]
    assert [n.args[2].__name__ for n in updates] == ["addcmul.default"]
    arguments = momentum_arguments(False)
    got = module(*arguments)
    assert all(torch.equal(w, h) for w, h in zip(expected, got, strict=True))
    assert torch.equal(arguments[1], torch.full((4,), 2.0))  # the buffer: never written
    # the check computed after the buffer's first op: that chain cannot wait for it
    module = momentum_graph(found_inf_first=False)
    assert in_place.guarded_updates(module) == 1
    updates = [n for n in module.graph.nodes if n.target is in_place.update_unless]
    assert [n.args[2].__name__ for n in updates] == ["addcmul.default"]


def test_an_op_that_returns_a_view_its_schema_does_not_declare_blocks_the_write():
    """aten._unsafe_view declares a new tensor but returns a view: a write into its input
    would change the view read after it."""

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x * 2.0
        v = torch.ops.aten._unsafe_view(a, [12])
        b = a + 1.0
        return b, v * 1.0

    x = torch.arange(12.0).reshape(3, 4)
    module = traced(step, x)
    expected = module(x)
    assert made_in_place(module) == set()
    for want, have in zip(expected, module(x), strict=True):
        assert torch.equal(want, have)


def kept_pair_graph(reader: str) -> tuple[fx.GraphModule, tuple[torch.Tensor, ...]]:
    """A guard keeping p and q, with new_q reading p (``reader="update"``) or a view of p
    read after the guard (``reader="view"``)."""
    graph = fx.Graph()
    found_inf, p, q, grad = (graph.placeholder(name) for name in ("found_inf", "p", "q", "g"))
    add = torch.ops.aten.add.Tensor
    new_p = graph.call_function(add, (p, grad))
    new_q = graph.call_function(add, (q, p if reader == "update" else grad))
    view = graph.call_function(torch.ops.aten.t.default, (p,))
    select = graph.call_function(select_on_host, (found_inf, p, new_p, q, new_q))
    kept = [graph.call_function(operator.getitem, (select, i)) for i in (0, 1)]
    after = graph.call_function(torch.ops.aten.clone.default, (view,))  # after the guard
    graph.output((*kept, after))
    for node in (p, q, grad, new_p, new_q):
        node.meta["val"] = torch.empty(2, 2)
    found_inf.meta["val"] = torch.tensor(False)
    arguments = (torch.tensor(False), torch.eye(2), torch.zeros(2, 2), torch.full((2, 2), 5.0))
    return fx.GraphModule(torch.nn.Module(), graph), arguments


def test_a_kept_tensor_another_update_or_a_later_view_reads_is_not_written():
    for reader in ("update", "view"):
        module, arguments = kept_pair_graph(reader)
        expected = module(*(a.clone() for a in arguments))
        # p is read by q's update (which would run after p's, both moved before the guard)
        # or by a view read after the guard: only q's update may be moved
        assert in_place.guarded_updates(module) == 1, reader
        moved = [n.name for n in module.graph.nodes if n.target is in_place.update_unless]
        assert moved == ["add_tensor_1"], (reader, moved)
        for want, have in zip(expected, module(*arguments), strict=True):
            assert torch.equal(want, have), reader


def test_the_disjoint_pieces_of_a_buffer_of_the_graph_own_their_memory():
    """A bucket: gradients concatenated, scaled, split into pieces; each piece is written
    by the op that reads it, unless the whole bucket is read afterwards."""

    def bucket(a: torch.Tensor, b: torch.Tensor, read_whole: bool) -> tuple[torch.Tensor, ...]:
        flat = torch.cat([a.reshape(-1), b.reshape(-1)]) * 0.5
        first, second = flat.split([a.numel(), b.numel()])
        out = (first.view(a.shape) * 3.0, second.view(b.shape) * 5.0)
        return (*out, flat.sum()) if read_whole else out

    a, b = torch.randn(2, 3), torch.randn(4)
    for read_whole in (False, True):
        module = traced(functools.partial(bucket, read_whole=read_whole), a, b)
        expected = module(a, b)
        changed = made_in_place(module)
        pieces = {name for name in changed if name.startswith("mul.Tensor:mul_")}
        # the scaling of the concatenation is always in place; the pieces only when nothing
        # reads the whole bucket afterwards (split has another user then)
        assert "mul.Tensor:mul" in changed
        assert pieces == (set() if read_whole else {"mul.Tensor:mul_1", "mul.Tensor:mul_2"})
        for want, have in zip(expected, module(a, b), strict=True):
            assert torch.equal(want, have)


def test_the_fused_finite_check_flags_what_the_traced_one_flags_and_writes_nothing():
    generator = torch.Generator().manual_seed(0)
    gradients = [torch.randn(shape, generator=generator) for shape in ((3, 5), (7,), (2, 2, 2))]
    assert not bool(any_non_finite(*gradients)) and not bool(non_finite(*gradients))
    for bad in (float("nan"), float("inf"), -float("inf")):
        for index in (0, len(gradients) - 1):
            poisoned = [g.clone() for g in gradients]
            poisoned[index].view(-1)[-1] = bad
            before = [g.clone() for g in poisoned]
            assert bool(any_non_finite(*poisoned)) and bool(non_finite(*poisoned))
            for after, kept in zip(poisoned, before, strict=True):  # written back unchanged
                assert torch.equal(after.isnan(), kept.isnan())
                assert torch.equal(after.nan_to_num(), kept.nan_to_num())
    # tensors the fused kernel cannot take: a broadcast view (one element many times), ints
    broadcast = torch.tensor([1.0, float("inf")]).expand(3, 2)
    assert bool(any_non_finite(gradients[0], broadcast))
    assert not bool(any_non_finite(gradients[1], torch.arange(4)))


def test_the_fused_finite_check_counts_as_a_reader_for_writes_after_it():
    graph = fx.Graph()
    gradient, scale = graph.placeholder("gradient"), graph.placeholder("scale")
    unscaled = graph.call_function(torch.ops.aten.mul.Tensor, (gradient, 2.0))  # its own buffer
    flag = graph.call_function(any_non_finite, (unscaled,))  # reads it before the write below
    result = graph.call_function(torch.ops.aten.mul.Tensor, (unscaled, scale))
    graph.output((flag, result))
    for node, value in ((gradient, torch.empty(2)), (scale, torch.empty(())), (flag, False)):
        node.meta["val"] = torch.tensor(value) if isinstance(value, bool) else value
    unscaled.meta["val"] = result.meta["val"] = torch.empty(2)  # what make_fx records
    module = fx.GraphModule(torch.nn.Module(), graph)
    assert in_place.in_place(module) == 1  # the second multiplication writes into the first's
    assert result.target is torch.ops.aten.mul_.Tensor
    inputs = torch.tensor([1.0, float("inf")]), torch.tensor(3.0)
    found, value = module(*inputs)
    assert bool(found) and torch.equal(value, torch.tensor([6.0, float("inf")]))
    assert torch.equal(inputs[0], torch.tensor([1.0, float("inf")]))  # a placeholder: never


def test_unscaling_inside_the_check_equals_unscaling_then_checking():
    generator = torch.Generator().manual_seed(1)
    inverse = torch.tensor(1 / 1024)
    for poison in (None, float("inf"), float("nan")):
        gradients = [torch.randn(4, 3, generator=generator) * 1e3 for _ in range(3)]
        if poison is not None:
            gradients[1][2, 1] = poison
        expected = [g * inverse for g in gradients]
        flag = unscale_and_check(inverse, *gradients)  # in place
        assert bool(flag) == (poison is not None) == bool(non_finite(*expected))
        for got, want in zip(gradients, expected, strict=True):
            assert torch.equal(got.nan_to_num(), want.nan_to_num())
    # the fallback (a tensor the kernel cannot take) unscales and checks the same
    strided = torch.randn(3, 8, generator=generator)[:, ::2]
    expected = strided * inverse
    assert not bool(unscale_and_check(inverse, strided)) and torch.equal(strided, expected)


def test_below_a_scale_of_one_the_unscaled_gradients_are_checked():
    # GradScaler's kernel checks the scaled values: 3e38 is finite, times 2 it is not.
    gradients = [torch.tensor([3e38, 1.0]), torch.tensor([2.0])]
    assert bool(unscale_and_check(torch.tensor(2.0), *gradients))  # scale 0.5
    assert torch.isinf(gradients[0][0]) and float(gradients[1][0]) == 4.0


def test_write_back_copies_each_new_state_into_the_argument_it_replaces():
    """The compiled step's form: new = p + g is written into p, which the graph returns; an
    output of another shape, and one that is its placeholder, are left as they are."""

    def step(p: torch.Tensor, q: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (p + g).sum(), p + g, q, g.sum(0)

    p, q, g = torch.ones(2, 3), torch.zeros(4), torch.full((2, 3), 2.0)
    module = traced(step, p, q, g)
    names = [n.name for n in module.graph.nodes if n.op == "placeholder"]
    eager.write_back(module, [(1, names[0]), (2, names[1]), (3, names[1])])
    copies = [n for n in module.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert [c.args[0].name for c in copies] == [names[0]]
    loss, new_p, same_q, summed = module(p, q, g)
    assert new_p is p and torch.equal(p, torch.full((2, 3), 3.0)) and float(loss) == 18.0
    assert same_q is q and torch.equal(summed, torch.full((3,), 4.0))


def test_a_softmax_backward_written_into_its_dead_gradient_computes_the_same_bits():
    """The row-wise backward ops in_place writes into their incoming gradient (or could write
    into the saved output): on this torch's CPU kernels, bit for bit the values written into a
    new tensor, along any dimension, with and without a vector tail, float32 and bfloat16."""
    aten = torch.ops.aten
    generator = torch.Generator().manual_seed(0)
    cases = [((64, 30522), 1), ((7, 33), 1), ((3, 5, 17), -1), ((3, 5, 17), 1), ((3, 5, 17), 0)]
    for dtype in (torch.float32, torch.bfloat16):
        for shape, dim in cases:
            x = (torch.randn(shape, generator=generator) * 3).to(dtype)
            gradient = torch.randn(shape, generator=generator).to(dtype)
            for op, forward, out in (
                (aten._log_softmax_backward_data, torch.log_softmax, "out"),
                (aten._softmax_backward_data, torch.softmax, "grad_input"),
            ):
                output = forward(x, dim)
                want = op.default(gradient, output, dim, dtype)
                for into_gradient in (True, False):
                    g, o = gradient.clone(), output.clone()
                    target = g if into_gradient else o
                    have = op.out(g, o, dim, dtype, **{out: target})
                    assert have.data_ptr() == target.data_ptr()
                    bits = torch.int32 if dtype == torch.float32 else torch.int16
                    assert torch.equal(have.view(bits), want.view(bits)), (op, shape, dim, dtype)


def test_a_log_softmax_backward_writes_into_a_gradient_nothing_reads_later():
    def step(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
        def loss(x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(x, target)

        return torch.func.grad(loss)(logits), logits * 2.0

    logits, target = torch.randn(6, 40), torch.randint(0, 40, (6,))
    module = traced(step, logits, target)
    expected = module(logits.clone(), target)
    changed = made_in_place(module)
    assert any(name.startswith("_log_softmax_backward_data") for name in changed), changed
    backward = torch.ops.aten._log_softmax_backward_data.default
    node = next(n for n in module.graph.nodes if n.meta.get("graphamp_functional") is backward)
    assert node.kwargs["out"] is node.args[0]  # written into its incoming gradient
    assert in_place.written_into_first(node)  # what cuda_paths.py counts on a GPU
    assert not any(in_place.written_into_first(n) for n in module.graph.nodes if n is not node)
    got = module(logits, target)
    for want, have in zip(expected, got, strict=True):
        assert torch.equal(want, have)
    eager.for_compile(module)  # the functional form again: a new tensor
    assert "out" not in node.kwargs and node.target is backward
    assert not in_place.written_into_first(node)


def test_a_row_wise_backward_is_written_into_its_gradient_only_on_the_devices_named(
    monkeypatch,
):
    """The backward's out= form is an opt-in by device type (its kernels' order of reads and
    writes checked there); an eager step on a CUDA device names CUDA too, and cuda_paths.py's
    run without the CUDA-only passes (on_cuda answering False) does not."""

    def step(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.func.grad(lambda x: torch.nn.functional.cross_entropy(x, target))(logits)

    logits, target = torch.randn(6, 40), torch.randint(0, 40, (6,))
    backward = torch.ops.aten._log_softmax_backward_data.default

    def written_into_gradient(into_first_on: tuple[str, ...]) -> bool:
        module = traced(step, logits, target)
        in_place.in_place(module, into_first_on=into_first_on)
        return any(n.meta.get("graphamp_functional") is backward for n in module.graph.nodes)

    assert written_into_gradient(("cpu",)) and written_into_gradient(("cpu", "cuda"))
    assert not written_into_gradient(("cuda",)) and not written_into_gradient(())
    named = []
    monkeypatch.setattr(
        in_place, "in_place", lambda module, into_first_on: named.append(into_first_on)
    )
    for cuda in (True, False):
        monkeypatch.setattr(eager, "on_cuda", lambda module, cuda=cuda: cuda)
        eager.for_eager(traced(step, logits, target))
    assert named == [("cpu", "cuda"), ("cpu",)]


def counter_step(reader_between: bool = False, update_read: bool = False):  # type: ignore[no-untyped-def]
    """A traced state update as functionalisation writes a batch norm's counter: an add, then
    a copy back into the state (with another reader of the state between the two, or of the
    new value besides the copy)."""

    def f(state: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        new = torch.add(state, 1)
        seen = state * 3 if reader_between else x * 3
        state.copy_(new)
        return (seen, new * 2) if update_read else (seen,)

    return traced(f, torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.int64))


def run_counter(module: fx.GraphModule) -> tuple[torch.Tensor, ...]:
    state = torch.arange(4)
    outputs = module(state, torch.ones(4, dtype=torch.int64))
    return (state, *outputs)


def test_a_copy_back_of_an_update_becomes_the_update_in_place_and_functional_undoes_it():
    expected = run_counter(counter_step())
    module = counter_step()
    assert in_place.copied_back_in_place(module) == 1
    targets = [n.target for n in module.graph.nodes]
    assert torch.ops.aten.copy_.default not in targets and torch.ops.aten.add_.Tensor in targets
    assert all(torch.equal(a, b) for a, b in zip(run_counter(module), expected, strict=True))
    in_place.functional(module)  # for torch.compile: the add and its copy back again
    targets = [n.target for n in module.graph.nodes]
    assert torch.ops.aten.copy_.default in targets and torch.ops.aten.add.Tensor in targets
    assert all(torch.equal(a, b) for a, b in zip(run_counter(module), expected, strict=True))


def test_a_copy_back_with_a_reader_between_or_an_update_read_elsewhere_stays():
    for module in (counter_step(reader_between=True), counter_step(update_read=True)):
        expected = run_counter(module)
        assert in_place.copied_back_in_place(module) == 0
        assert all(torch.equal(a, b) for a, b in zip(run_counter(module), expected, strict=True))


def test_a_batch_norm_step_counts_its_batches_in_place_with_the_same_values(monkeypatch):
    """The eager step of a network with a batch norm: ``num_batches_tracked`` is added to in
    place (no copy back), and three steps give the weights and statistics of the step
    without this pass, bit for bit."""
    from graphamp.fx import train_step
    from tests.training.test_partition import batch, conv_net

    def trained(with_pass: bool) -> tuple[torch.nn.Module, fx.Graph]:
        if not with_pass:
            monkeypatch.setattr(in_place, "copied_back_in_place", lambda module: 0)
        model = conv_net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        step = train_step(model, torch.nn.functional.cross_entropy, optimizer, dtype="bfloat16")
        for seed in range(3):
            step(*batch(seed))
        monkeypatch.undo()
        return model, step.captured["update"].module.graph

    model, graph = trained(with_pass=True)
    plain, plain_graph = trained(with_pass=False)
    copies = [n for n in graph.nodes if n.target is torch.Tensor.copy_]
    assert not copies and [n for n in plain_graph.nodes if n.target is torch.Tensor.copy_]
    assert int(model[1].num_batches_tracked) == 3
    for a, b in zip(model.state_dict().values(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b)
