"""Hugging Face ``transformers`` cache objects as pytree nodes, so that torch.export captures
models as they come: a decoder's output holds a ``DynamicCache`` unless the caller sets
``use_cache=False``, an encoder-decoder's an ``EncoderDecoderCache``, and a caller may pass a
``StaticCache`` in. torch.export only sees tensors in containers it knows how to flatten.

* ``DynamicCache``: transformers' own registration (``register_dynamic_cache_export_support``),
  its keys and values per layer.
* ``EncoderDecoderCache``: its self-attention and cross-attention caches.
* ``StaticCache``: each layer's tensors (keys, values, the cumulative length), its other plain
  fields kept in the context, so the output cache is rebuilt with the layers' classes.

Registered when a model of transformers is captured (``transformers`` is then imported) and when
a ``.pt2`` program whose inputs or outputs hold them is read (its call specification names the
classes); call :func:`register_caches` before ``torch.export.load`` of such a program.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import torch
import torch.utils._pytree as pytree

from graphamp.errors import GraphampError

_PLAIN = (int, float, bool, str, type(None))


def register_caches(*, import_transformers: bool = False) -> None:
    """Register transformers' cache classes with torch's pytree (once; idempotent). Without
    ``import_transformers`` only when transformers is already imported."""
    if "transformers" not in sys.modules and not import_transformers:
        return
    from transformers import cache_utils

    if cache_utils.DynamicCache not in pytree.SUPPORTED_NODES:
        from transformers.integrations.executorch import register_dynamic_cache_export_support

        register_dynamic_cache_export_support()
    if cache_utils.EncoderDecoderCache not in pytree.SUPPORTED_NODES:
        pytree.register_pytree_node(
            cache_utils.EncoderDecoderCache,
            _encoder_decoder_flatten,
            _encoder_decoder_unflatten,
            serialized_type_name="transformers.cache_utils.EncoderDecoderCache",
            flatten_with_keys_fn=_encoder_decoder_flatten_with_keys,
        )
    if cache_utils.StaticCache not in pytree.SUPPORTED_NODES:
        pytree.register_pytree_node(
            cache_utils.StaticCache,
            _static_flatten,
            _static_unflatten,
            serialized_type_name="transformers.cache_utils.StaticCache",
            flatten_with_keys_fn=_static_flatten_with_keys,
        )


_SUBCACHES = ("self_attention_cache", "cross_attention_cache")


def _encoder_decoder_flatten(cache: Any) -> tuple[list[Any], None]:
    return [getattr(cache, name) for name in _SUBCACHES], None


def _encoder_decoder_flatten_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], None]:
    return [(pytree.GetAttrKey(name), getattr(cache, name)) for name in _SUBCACHES], None


def _encoder_decoder_unflatten(values: Iterable[Any], context: None) -> Any:
    from transformers.cache_utils import EncoderDecoderCache

    return EncoderDecoderCache(*values)


def _static_parts(cache: Any) -> tuple[list[tuple[str, torch.Tensor]], list[Any]]:
    """(name, tensor) per layer field, and the JSON-able context: per layer its class and its
    plain fields, then the cache's own plain fields."""
    if getattr(cache, "offloading", False):
        raise GraphampError("a StaticCache with offloading=True cannot be captured")
    tensors: list[tuple[str, torch.Tensor]] = []
    layers = []
    for index, layer in enumerate(cache.layers):
        if not getattr(layer, "is_initialized", False):
            raise GraphampError(
                f"StaticCache layer {index} is not initialised: call "
                "cache.early_initialization(...) before capturing (torch.export needs its tensors)"
            )
        fields = vars(layer)
        names = sorted(k for k, v in fields.items() if isinstance(v, torch.Tensor))
        plain = {k: v for k, v in sorted(fields.items()) if isinstance(v, _PLAIN)}
        tensors += [(f"layers_{index}_{name}", fields[name]) for name in names]
        layers.append([type(layer).__name__, names, plain])
    own = {k: v for k, v in sorted(vars(cache).items()) if isinstance(v, _PLAIN)}
    return tensors, [layers, own]


def _static_flatten(cache: Any) -> tuple[list[torch.Tensor], list[Any]]:
    tensors, context = _static_parts(cache)
    return [tensor for _, tensor in tensors], context


def _static_flatten_with_keys(cache: Any) -> tuple[list[tuple[Any, torch.Tensor]], list[Any]]:
    tensors, context = _static_parts(cache)
    return [(pytree.GetAttrKey(name), tensor) for name, tensor in tensors], context


def _static_unflatten(values: Iterable[torch.Tensor], context: list[Any]) -> Any:
    from transformers import cache_utils

    layers_context, own = context
    remaining = list(values)
    layers = []
    for class_name, names, plain in layers_context:
        layer = object.__new__(getattr(cache_utils, class_name))
        layer.__dict__.update(plain)
        for name in names:
            setattr(layer, name, remaining.pop(0))
        layer.device = layer.keys.device
        layers.append(layer)
    cache = object.__new__(cache_utils.StaticCache)
    cache.__dict__.update(own)
    cache.layers = layers
    cache.layer_class_to_replicate = None
    return cache
