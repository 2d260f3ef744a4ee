"""Policy: the target dtype, the four op lists and the name rules, from code or a TOML file.

The default lists are data (``graphamp/lists/<dialect>_<dtype>.toml``), each entry with its
reason. A user moves op types between lists (naming an op under one list takes it out of the
others), denies nodes by name glob and tensors by name, and keeps graph inputs/outputs in
float32. The older words white/gray/black are accepted as aliases of allow/infer/deny.

A policy file looks like::

    [graphamp]
    dtype = "float16"
    target = "cuda"                 # ONNX: the provider whose kernels decide (cuda, cpu, any)
    keep_io_types = true            # or a list of input/output names
    allow = ["Einsum"]
    deny = ["Softmax"]
    deny_names = ["/encoder/layer.11/*"]
    deny_tensors = ["logits"]
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeGuard

from graphamp.core.dtypes import TARGET_TYPES
from graphamp.core.vocab import ListName
from graphamp.errors import GraphampError, did_you_mean
from graphamp.policy.config import parse, read_table

LISTS = tuple(ListName)
# How infer and clear ops are decided: by the bytes Casts and weights move (the cost pass, a
# minimum cut: ONNX's default), TensorFlow's colouring (the paint pass), autocast's type
# promotion (the promote pass: an op computes in the promoted type of its inputs), or every
# op low that nothing keeps float32 (the spread_all pass: the peers' float16 tools, Paddle O2).
SPREADS = ("cost", "tensorflow", "autocast", "all")
ALIASES = {"white": "allow", "gray": "infer", "grey": "infer", "black": "deny"}
DTYPES = TARGET_TYPES
POLICY_KEYS = frozenset(
    {
        "dtype",
        "target",
        "spread",
        "keep_io_types",
        "fuse",
        "inline_functions",
        "allow_names",
        "deny_names",
        "deny_tensors",
        *LISTS,
        *ALIASES,
    }
)
# Runtimes an ONNX model is converted for: an op goes low only where the provider has a kernel
# for the low type (rule no_kernel); "any" checks no kernels.
TARGETS = ("cuda", "cpu", "any")
# Keys of the [graphamp] table that are not policy: [[graphamp.check]] entries for CI.
OTHER_KEYS = frozenset({"check"})


def _lists_of_names(where: str, **options: object) -> dict[str, Any]:
    """Each option as a tuple of names, read once (a generator would be spent by a check
    that read it first), or ``keep_io_types``'s True/False as it is. A string where a list
    of names belongs is one clear error: iterated, ``"Softmax"`` would be the ops S, o, f, ...
    and ``"/layers.1/*"`` a rule ``*`` matching every node."""
    read: dict[str, Any] = {}
    for option, value in options.items():
        if isinstance(value, str | bytes):
            raise GraphampError(
                f"{where}: {option}={value!r} is one string, not a list of names: "
                f"pass {option}=[{value!r}]"
            )
        if isinstance(value, bool):  # keep_io_types=True: every input and output
            read[option] = value
            continue
        if not isinstance(value, Iterable):
            raise GraphampError(f"{where}: {option} is a list of names, got {value!r}")
        names = tuple(value)
        wrong = next((item for item in names if not isinstance(item, str)), None)
        if wrong is not None:
            raise GraphampError(f"{where}: {option} holds {wrong!r}, not a name (a string)")
        read[option] = names
    return read


def _canonical_list(name: str) -> str:
    return ALIASES.get(name, name)


def load_default_lists(dialect: str, dtype: str) -> dict[str, dict[str, str]]:
    """The shipped lists for ``dialect`` and ``dtype``: list name -> {op: reason}."""
    data = _list_file(dialect, dtype)
    lists: dict[str, dict[str, str]] = {}
    for name in LISTS:
        entries = data.get(name, {})
        if not isinstance(entries, dict):
            raise GraphampError(f"{dialect}_{dtype}.toml: [{name}] must be a table of ops")
        lists[name] = {str(op): str(reason) for op, reason in entries.items()}
    _check_disjoint({name: list(ops) for name, ops in lists.items()}, f"{dialect}_{dtype}.toml")
    return lists


def default_spread(dialect: str, dtype: str) -> str:
    """How the shipped lists of ``dialect`` spread precisions (their ``spread`` key)."""
    spread = str(_list_file(dialect, dtype).get("spread", "tensorflow"))
    if spread not in SPREADS:
        raise GraphampError(f"{dialect}_{dtype}.toml: unknown spread {spread!r}")
    return spread


def _check_dtype(dtype: str, where: str = "") -> None:
    if dtype not in DTYPES:
        source = f"{where}: " if where else ""
        raise GraphampError(f"{source}unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")


def _list_file(dialect: str, dtype: str) -> dict[str, object]:
    _check_dtype(dtype)
    resource = resources.files("graphamp.lists").joinpath(f"{dialect}_{dtype}.toml")
    return parse(resource.read_text(encoding="utf-8"), f"{dialect}_{dtype}.toml")


def _strings(value: object) -> TypeGuard[list[str]]:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _move(lists: dict[str, dict[str, str]], moves: Mapping[str, Iterable[str]], where: str) -> None:
    """Move each op of ``moves`` into its list, out of every other, crediting ``where``."""
    for list_name, ops in moves.items():
        for op in ops:
            for other in LISTS:
                lists[other].pop(op, None)
            lists[list_name][op] = f"moved to {list_name} by {where}"


def _check_disjoint(lists: Mapping[str, Iterable[str]], where: str) -> None:
    seen: dict[str, str] = {}
    for list_name in LISTS:
        for op in lists.get(list_name, ()):
            if op in seen and seen[op] != list_name:
                raise GraphampError(
                    f"{where}: op {op!r} is in both the {seen[op]} and the {list_name} list"
                )
            seen[op] = list_name


@dataclass
class Policy:
    """What to convert and how. Build with :meth:`Policy.create` or :meth:`Policy.from_toml`."""

    dtype: str = "float16"
    dialect: str = "onnx"
    lists: dict[str, dict[str, str]] = field(default_factory=dict)
    deny_names: tuple[str, ...] = ()
    deny_tensors: frozenset[str] = frozenset()
    # globs on node names and module paths: low wherever schema, kernel and weights allow
    allow_names: tuple[str, ...] = ()
    # True: every graph input and output keeps its type; a tuple: only those names; False: none.
    keep_io_types: bool | tuple[str, ...] = False
    source: str = "defaults"
    spread: str = "tensorflow"  # see SPREADS (a plan from before "cost" existed: tensorflow)
    moved_ops: tuple[str, ...] = ()  # op types the user named in a list (file or flags)
    target: str = "cuda"  # see TARGETS (ONNX models)
    # Replace decomposed patterns (an RMSNorm's Pow ... Mul) by a fused op where the target
    # has one (the fuse_norms pass); False keeps the model's own ops (--no-fuse).
    fuse: bool = True
    # Write each call of a model-local function with its body inline instead of as a call of
    # a function copy specialised to it (--inline-functions); the decisions are the same.
    inline_functions: bool = False

    @classmethod
    def create(
        cls,
        dtype: str = "float16",
        *,
        dialect: str = "onnx",
        allow: Iterable[str] = (),
        infer: Iterable[str] = (),
        clear: Iterable[str] = (),
        deny: Iterable[str] = (),
        deny_names: Iterable[str] = (),
        deny_tensors: Iterable[str] = (),
        allow_names: Iterable[str] = (),
        keep_io_types: bool | Iterable[str] = False,
        target: str = "cuda",
        fuse: bool = True,
        inline_functions: bool = False,
        spread: str | None = None,
        where: str = "policy",
        later_moves: Mapping[str, Iterable[str]] | None = None,
        later_where: str = "command line",
        **aliases: Iterable[str],
    ) -> Policy:
        """The default lists for ``dtype`` with the given ops moved into the named lists.

        ``where`` names the source (a file, "command line") in error messages and in the
        reasons of moved ops; ``later_moves`` are moves from a second source (command-line
        flags over a file), applied after the first and credited to ``later_where``.
        """
        _check_dtype(dtype, where)
        read = _lists_of_names(
            where,
            allow=allow,
            infer=infer,
            clear=clear,
            deny=deny,
            deny_names=deny_names,
            deny_tensors=deny_tensors,
            allow_names=allow_names,
            keep_io_types=keep_io_types,
            **aliases,
        )
        moves = {name: list(read[name]) for name in ("allow", "infer", "clear", "deny")}
        for alias in aliases:
            if alias not in ALIASES:
                raise GraphampError(f"{where}: unknown option {alias!r}")
            moves[_canonical_list(alias)].extend(read[alias])
        _check_disjoint(moves, where)
        if target not in TARGETS:
            raise GraphampError(f"{where}: target {target!r} is not one of {', '.join(TARGETS)}")
        if spread is not None and spread not in SPREADS:
            raise GraphampError(f"{where}: spread {spread!r} is not one of {', '.join(SPREADS)}")
        lists = load_default_lists(dialect, dtype)
        _move(lists, moves, where)
        if later_moves:
            _move(lists, later_moves, later_where)
        keep: bool | tuple[str, ...] = read["keep_io_types"]
        if not isinstance(keep, bool):
            keep = tuple(sorted(set(keep)))
        named = [op for ops in (*moves.values(), *(later_moves or {}).values()) for op in ops]
        return cls(
            dtype=dtype,
            dialect=dialect,
            spread=spread or default_spread(dialect, dtype),
            moved_ops=tuple(dict.fromkeys(named)),
            lists=lists,
            deny_names=read["deny_names"],
            deny_tensors=frozenset(read["deny_tensors"]),
            allow_names=read["allow_names"],
            keep_io_types=keep,
            source=where,
            target=target,
            fuse=fuse,
            inline_functions=inline_functions,
        )

    @classmethod
    def from_mapping(
        cls,
        table: Mapping[str, object],
        *,
        where: str,
        default_dtype: str | None = None,
        **overrides: Any,
    ) -> Policy:
        """A policy from a ``[graphamp]`` table; ``overrides`` (command-line flags, as
        :meth:`create` takes them) win, and ``default_dtype`` applies when neither sets a dtype.

        An op a flag moves is taken out of the file's lists first, so ``--deny Softmax`` wins
        over ``infer = ["Softmax"]`` in the file; an op in two lists of one source is an error.
        Each move's reason names the source that made it.
        """
        table = {key: value for key, value in table.items() if key not in OTHER_KEYS}
        unknown = sorted(set(table) - POLICY_KEYS)
        if unknown:
            raise GraphampError(
                f"{where}: unknown key {unknown[0]!r} in [graphamp]"
                + did_you_mean(unknown[0], sorted(str(k) for k in POLICY_KEYS | OTHER_KEYS))
            )
        file_moves: dict[str, list[str]] = {}
        kwargs: dict[str, Any] = {}  # create()'s other keyword arguments
        for key, value in table.items():
            if key in ("dtype", "target", "spread") and not isinstance(value, str):
                raise GraphampError(f"{where}: {key!r} must be a string")
            if key in ("fuse", "inline_functions") and not isinstance(value, bool):
                raise GraphampError(f"{where}: {key!r} must be true or false")
            if key == "keep_io_types" and not (isinstance(value, bool) or _strings(value)):
                raise GraphampError(
                    f"{where}: 'keep_io_types' must be true, false or a list of strings"
                )
            plain = ("dtype", "target", "spread", "keep_io_types", "fuse", "inline_functions")
            if key not in plain and not _strings(value):
                raise GraphampError(f"{where}: {key!r} must be a list of strings")
            list_name = _canonical_list(key)
            if list_name in LISTS and _strings(value):
                file_moves.setdefault(list_name, []).extend(value)
            else:
                kwargs[key] = value
        _check_disjoint(file_moves, where)
        flag_moves: dict[str, list[str]] = {
            name: list(overrides.pop(name)) for name in LISTS if name in overrides
        }
        _check_disjoint(flag_moves, "command line")
        flagged = {op for ops in flag_moves.values() for op in ops}
        moves = {
            name: [op for op in file_moves.get(name, []) if op not in flagged] for name in LISTS
        }
        for key in ("deny_names", "deny_tensors", "allow_names"):
            if key in overrides:
                kwargs[key] = [*kwargs.get(key, []), *overrides.pop(key)]
        kwargs.update(overrides)
        if default_dtype is not None:
            kwargs.setdefault("dtype", default_dtype)
        return cls.create(
            where=where,
            later_moves=flag_moves,
            allow=moves[ListName.ALLOW],
            infer=moves[ListName.INFER],
            clear=moves[ListName.CLEAR],
            deny=moves[ListName.DENY],
            **kwargs,
        )

    @classmethod
    def from_toml(
        cls, path: str | Path, *, default_dtype: str | None = None, **overrides: Any
    ) -> Policy:
        """Load the ``[graphamp]`` table of a TOML file; ``overrides`` win over the file."""
        table = read_table(path)
        return cls.from_mapping(table, where=str(path), default_dtype=default_dtype, **overrides)

    @classmethod
    def from_record(cls, record: Mapping[str, Any], *, where: str) -> Policy:
        """The policy a plan file records (``Plan.policy``): what applying that plan needs."""
        try:
            keep = record.get("keep_io_types", False)
            lists: dict[str, dict[str, str]] = {
                name: {op: f"from {where}" for op in record["lists"][name]} for name in LISTS
            }
            return cls(
                dtype=str(record["dtype"]),
                dialect=str(record["dialect"]),
                spread=str(record.get("spread", "tensorflow")),
                lists=lists,
                deny_names=tuple(record.get("deny_names", ())),
                deny_tensors=frozenset(record.get("deny_tensors", ())),
                allow_names=tuple(record.get("allow_names", ())),
                keep_io_types=keep if isinstance(keep, bool) else tuple(keep),
                source=where,
                # plans written before targets existed checked no kernels
                target=str(record.get("target", "any")),
                # written only when off (a plan from before rewrites existed, made on a model
                # with a pattern to fuse, is refused by --from-plan: its decisions differ)
                fuse=bool(record.get("fuse", True)),
                inline_functions=bool(record.get("inline_functions", False)),
            )
        except (KeyError, TypeError) as exc:
            raise GraphampError(f"{where}: malformed policy in the plan ({exc})") from None

    # -- queries used by the passes -----------------------------------------------------------

    def list_of(self, op: str) -> tuple[ListName | None, str]:
        """The list holding ``op`` and the reason recorded for it; (None, "") if unlisted."""
        lists = self.lists
        for list_name in LISTS:
            listed = lists.get(list_name)
            reason = listed.get(op) if listed else None
            if reason is not None:
                return list_name, reason
        return None, ""

    def denied_name(self, *names: str) -> str | None:
        """The first ``deny_names`` glob matching any of ``names``, or None."""
        for pattern in self.deny_names:
            for name in names:
                if name and fnmatch.fnmatchcase(name, pattern):
                    return pattern
        return None

    def allowed_name(self, *names: str) -> str | None:
        """The first ``allow_names`` glob matching any of ``names``, or None."""
        for pattern in self.allow_names:
            for name in names:
                if name and fnmatch.fnmatchcase(name, pattern):
                    return pattern
        return None

    def keeps_io(self, name: str) -> bool:
        if isinstance(self.keep_io_types, bool):
            return self.keep_io_types
        return name in self.keep_io_types

    def to_dict(self) -> dict[str, object]:
        """The policy as recorded in a plan: enough to reproduce the decisions. ``spread`` is
        written only where it is not TensorFlow's (the default of every plan before it);
        ``fuse`` only where it is off, ``inline_functions`` only where it is on."""
        record: dict[str, object] = {"dtype": self.dtype, "dialect": self.dialect}
        if self.spread != "tensorflow":
            record["spread"] = self.spread
        if self.dialect == "onnx":
            record["target"] = self.target
            if not self.fuse:
                record["fuse"] = False
            if self.inline_functions:
                record["inline_functions"] = True
        record.update(
            lists={name: sorted(self.lists.get(name, {})) for name in LISTS},
            deny_names=list(self.deny_names),
            deny_tensors=sorted(self.deny_tensors),
            keep_io_types=self.keep_io_types
            if isinstance(self.keep_io_types, bool)
            else list(self.keep_io_types),
        )
        if self.allow_names:  # (written only when set: plans before it had none)
            record["allow_names"] = list(self.allow_names)
        return record
