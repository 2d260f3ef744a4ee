"""Policy: default lists as data, moves between lists, aliases, TOML files, errors."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest

from graphamp.errors import GraphampError
from graphamp.policy.policy import LISTS, Policy


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_default_lists_are_disjoint_and_every_entry_has_a_reason(dtype):
    data = tomllib.loads(
        resources.files("graphamp.lists").joinpath(f"onnx_{dtype}.toml").read_text()
    )
    seen: set[str] = set()
    for name in LISTS:
        for op, reason in data[name].items():
            assert op not in seen, op
            assert len(reason) > 10, (op, reason)
            seen.add(op)
    assert {"MatMul", "Gemm", "Conv"} <= set(data["allow"])


def test_bfloat16_lists_treat_reductions_as_infer():
    assert Policy.create("float16").list_of("ReduceMean")[0] == "deny"
    assert Policy.create("bfloat16").list_of("ReduceMean")[0] == "infer"


def test_moving_an_op_takes_it_out_of_its_default_list():
    policy = Policy.create(deny=["Softmax"], allow=["Exp"])
    assert policy.list_of("Softmax")[0] == "deny"
    assert "Softmax" not in policy.lists["infer"]
    assert policy.list_of("Exp")[0] == "allow"


def test_an_op_in_two_lists_is_an_error_naming_it():
    with pytest.raises(GraphampError, match=r"'Exp'.*allow.*deny"):
        Policy.create(allow=["Exp"], deny=["Exp"])


def test_white_gray_black_are_aliases():
    policy = Policy.create(white=["Exp"], black=["MatMul"], gray=["Sin"])
    assert policy.list_of("Exp")[0] == "allow"
    assert policy.list_of("MatMul")[0] == "deny"
    assert policy.list_of("Sin")[0] == "infer"


def test_unknown_dtype_is_an_error_naming_its_source():
    with pytest.raises(GraphampError, match=r"^amp\.toml: unknown dtype 'float8'"):
        Policy.create("float8", where="amp.toml")


@pytest.mark.parametrize(
    "option", ["allow", "infer", "clear", "deny", "black", "deny_names", "allow_names",
               "deny_tensors", "keep_io_types"]
)  # fmt: skip
def test_one_string_where_a_list_of_names_belongs_is_an_error(option):
    """Iterated, "/layers.1/*" would be the rules '/', 'l', ... and '*', which matches every
    node: the whole model float32, without a word."""
    with pytest.raises(GraphampError) as caught:
        Policy.create(**{option: "/layers.1/*"}, where="convert()")
    assert str(caught.value) == (
        f"convert(): {option}='/layers.1/*' is one string, not a list of names: "
        f"pass {option}=['/layers.1/*']"
    )


def test_policy_from_toml_with_command_line_overrides(tmp_path):
    path = tmp_path / "amp.toml"
    path.write_text(
        '[graphamp]\ndtype = "bfloat16"\nblack = ["Softmax"]\nkeep_io_types = ["x"]\n'
        'deny_names = ["/encoder/*"]\ndeny_tensors = ["logits"]\n'
    )
    policy = Policy.from_toml(path)
    assert policy.dtype == "bfloat16"
    assert policy.list_of("Softmax")[0] == "deny"
    assert policy.keeps_io("x") and not policy.keeps_io("y")
    assert policy.denied_name("/encoder/layer.0/MatMul") == "/encoder/*"
    assert "logits" in policy.deny_tensors
    # A flag wins over the file, even when it moves the same op elsewhere.
    flagged = Policy.from_toml(path, infer=["Softmax"], deny_names=["/head/*"])
    assert flagged.list_of("Softmax")[0] == "infer"
    assert flagged.deny_names == ("/encoder/*", "/head/*")


@pytest.mark.parametrize(
    "text, message",
    [
        ("[graphamp]\nallow = ['Exp']\ndeny = ['Exp']\n", "'Exp' is in both"),
        ("[graphamp]\ncolour = 'red'\n", "unknown key 'colour' in \\[graphamp\\]$"),
        ("[graphamp]\ndny = ['Exp']\n", r"key 'dny' in \[graphamp\]; did you mean 'deny'\?"),
        ("[graphamp]\nallow = 'Exp'\n", "'allow' must be a list"),
        # a number in the list once reached difflib's suggestions: an internal error (fuzz)
        ("[graphamp]\nkeep_io_types = [0]\n", "'keep_io_types' must be true, false or a list"),
        ("[other]\n", "no \\[graphamp\\] table"),
        ("[graphamp\n", "not a valid TOML"),
    ],
)
def test_bad_policy_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(GraphampError, match=message) as info:
        Policy.from_toml(path)
    assert str(path) in str(info.value)


def test_lists_given_as_generators_are_read_once_and_kept():
    """The check that refuses a string read a generator to its end, and the policy then
    found it empty: deny=(op for op in ...) denied nothing, without a word."""
    policy = Policy.create(
        deny=(op for op in ["Softmax"]),
        deny_names=iter(["/a/*"]),
        keep_io_types=map(str, ["x"]),
    )
    assert policy.list_of("Softmax")[0] == "deny"
    assert policy.deny_names == ("/a/*",) and policy.keep_io_types == ("x",)
