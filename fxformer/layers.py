"""Flax's `Module`, `Dense` and `LayerNorm`, whose stored parameters are checked against the
shape they are declared with, without tracing their initialisers.

`flax.linen.Module.param` of a parameter that exists (in every `apply`) checks the stored value's
shape by tracing its initialiser (`jax.eval_shape`): a third of the time it takes to trace the
model's forward pass. The modules here compare the stored shape with the shape the initialiser is
given (its first argument, as Flax's own layers and the model's declare every parameter) and
raise Flax's own error where they differ; a declaration without one goes through Flax's check.
Initialisation (`init`) is Flax's, unchanged: the same names, values and random keys.
"""

from __future__ import annotations

import flax.linen as nn
import numpy as np
from flax import errors


class Module(nn.Module):
    """`nn.Module` whose `param`, for a parameter that exists, checks its declared shape."""

    @nn.nowrap
    def param(self, name: str, init_fn, *init_args, unbox: bool = True, **init_kwargs):
        shape = init_args[0] if init_args else None
        if not unbox or not isinstance(shape, (tuple, list)) or not self.has_variable("params", name):
            return super().param(name, init_fn, *init_args, unbox=unbox, **init_kwargs)
        value = self.variable("params", name).value
        if np.shape(value) != tuple(shape):
            raise errors.ScopeParamShapeError(name, self.scope.path_text, np.shape(value), tuple(shape))
        return value


class Dense(Module, nn.Dense):
    """`flax.linen.Dense`, its stored parameters checked by their declared shapes."""


class LayerNorm(Module, nn.LayerNorm):
    """`flax.linen.LayerNorm`, its stored parameters checked by their declared shapes."""
