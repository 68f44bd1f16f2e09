"""Section 5.3 and 5.4: Adam with the warm-up schedule, and label-smoothed cross-entropy."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fxformer.config import ema_decays
from fxformer.kernels import projected_loss
from fxformer.metrics import TOKEN_SUMS
from fxformer.model import output_bias, shared_embedding, vocabulary_logits
from fxformer.tokens import PAD_ID

Array = jax.Array


def paper_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), for step = 1, 2, ...

    optax counts updates from 0, so update number `count` is the paper's step `count + 1`.
    """

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """The paper's schedule for an experiment config."""
    return paper_schedule(config.model.d_model, config.warmup_steps, config.learning_rate_scale)


def optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Adam(beta1, beta2, epsilon) = (0.9, 0.98, 1e-9) with the paper's schedule; with
    `flat_update`, over all parameters as one vector (the same update, element for element);
    with `ema_decay`, smoothed weights kept beside it (`with_smoothed_weights`)."""
    return with_smoothed_weights(adam_of(config), ema_decays(config))


def ema_key(decay: float) -> str:
    """The name of a decay's smoothed weights in the optimizer state: `0_9999` for 0.9999."""
    return f"{decay:.10g}".replace(".", "_")


def with_smoothed_weights(
    inner: optax.GradientTransformation, decays: tuple[float, ...]
) -> optax.GradientTransformation:
    """`inner` (no decays: itself, the state unchanged), its state kept under "inner" beside
    "ema": for each decay d, an exponential moving average of the parameters after every update,
    e_n = d e_(n-1) + (1 - d) theta_n from e_0 = 0. `smoothed` divides it by 1 - d^n (the
    debiasing of Adam's moments), so that the weights are sum_k (1 - d) d^(n-k) theta_k normalized
    over the n steps taken, with no weight left on the initial parameters."""
    if not decays:
        return inner

    def init(params):
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        return {"inner": inner.init(params), "ema": {ema_key(d): zeros for d in decays}}

    def update(updates, state, params=None):
        updates, inner_state = inner.update(updates, state["inner"], params)
        new_params = optax.apply_updates(params, updates)
        ema = {
            ema_key(d): jax.tree.map(
                lambda e, p, d=d: d * e + (1.0 - d) * p.astype(jnp.float32), state["ema"][ema_key(d)], new_params
            )
            for d in decays
        }
        return updates, {"inner": inner_state, "ema": ema}

    return optax.GradientTransformation(init, update)


def smoothed(ema, decay: float, step: int):
    """The smoothed weights at `step` from the average the state keeps (`with_smoothed_weights`)."""
    return jax.tree.map(lambda e: e / (1.0 - decay**step), ema)


def adam_of(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """The paper's Adam with its schedule (flattened with `flat_update`)."""
    adam = optax.adam(learning_rate_schedule(config), b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)
    return optax.flatten(adam) if config.flat_update else adam


# What `cross_entropy_sums` adds up over the weighted target tokens, in its order: the
# label-smoothed loss, the plain NLL, correct guesses, tokens (`metrics.per_token` divides by the last).
SUMS = TOKEN_SUMS


@jax.custom_vjp
def log_sum_exp(logits: Array) -> Array:
    """log sum_v exp(logits[..., v]) in float32, for logits of any float dtype. Its gradient,
    softmax(logits), is computed from the logits and this result in one pass and returned in the
    logits' dtype: nothing of the size [..., vocab] is kept from the forward pass but the logits."""
    x = logits.astype(jnp.float32)
    top = jax.lax.stop_gradient(x.max(axis=-1, keepdims=True))
    return jnp.log(jnp.exp(x - top).sum(axis=-1)) + top[..., 0]


def _log_sum_exp_forward(logits: Array) -> tuple[Array, tuple[Array, Array]]:
    out = log_sum_exp(logits)
    return out, (logits, out)


def _log_sum_exp_backward(residuals: tuple[Array, Array], g: Array) -> tuple[Array]:
    logits, out = residuals
    softmax = jnp.exp(logits.astype(jnp.float32) - out[..., None])
    return ((g[..., None] * softmax).astype(logits.dtype),)


log_sum_exp.defvjp(_log_sum_exp_forward, _log_sum_exp_backward)


def _q(targets: Array, vocab: int, label_smoothing: float) -> tuple[Array, Array]:
    """(is the target [..., vocab], the smoothed target distribution q [..., vocab])."""
    is_target = jnp.arange(vocab, dtype=targets.dtype) == targets[..., None]
    return is_target, jnp.where(is_target, 1.0 - label_smoothing, label_smoothing / (vocab - 1))


def cross_entropy_sums(logits: Array, targets: Array, weights: Array, label_smoothing: float) -> dict[str, Array]:
    """Sums over weighted target tokens of the label-smoothed loss, the plain NLL, and correct guesses.

    The smoothed target puts 1 - eps_ls on the reference token and eps_ls / (vocab - 1) on every
    other token; the loss is the cross-entropy against it. logits [..., vocab] (any float dtype,
    read in float32), targets and weights [...] (weight 0 for padding). Sums, not means, so that
    micro-batches and devices add up exactly; divide by `tokens` for per-token values.

    Written as reductions of the logits rather than through log_softmax, so that neither pass
    stores log-probabilities of the size [..., vocab]: the smoothed loss is log-sum-exp minus the
    q-weighted sum of the logits (q sums to 1), the NLL log-sum-exp minus the target's logit, and a
    guess is correct when the target's logit is the largest (a tie for the top counts as correct);
    the gradient with respect to the logits, softmax - q, is one fused pass.
    """
    with jax.named_scope("cross_entropy"):  # the name `fxformer.profile` finds in the compiled step's metadata
        vocab = logits.shape[-1]
        x = logits.astype(jnp.float32)
        lse = log_sum_exp(logits)
        is_target, q = _q(targets, vocab, label_smoothing)
        target_logit = jnp.where(is_target, x, 0.0).sum(-1)
        smoothed = lse - (q * x).sum(-1)  # -sum_v q(v) log p(v)
        nll = lse - target_logit
        correct = (target_logit >= x.max(-1)).astype(jnp.float32)
        sums = (smoothed * weights).sum(), (nll * weights).sum(), (correct * weights).sum(), weights.sum()
    return dict(zip(SUMS, sums, strict=True))


def _combine(a: tuple, b: tuple) -> tuple:
    """Two partial (max, sum of exp(x - max), q-weighted sum, target's logit) of a row as one."""
    (top_a, exp_a, q_a, target_a), (top_b, exp_b, q_b, target_b) = a, b
    top = jnp.maximum(top_a, top_b)
    rescaled = lambda t, e: e * jnp.where(t == top, 1.0, jnp.exp(t - top))  # noqa: E731 (-inf twice: 1, not nan)
    return top, rescaled(top_a, exp_a) + rescaled(top_b, exp_b), q_a + q_b, target_a + target_b


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def logit_reductions(logits: Array, targets: Array, label_smoothing: float) -> tuple[Array, Array, Array, Array]:
    """(log-sum-exp, sum_v q(v) x_v, the target's logit, the largest logit) of every position, in
    one pass over the logits [..., vocab] (any float dtype, read in float32): a variadic reduction
    that keeps a running maximum and rescales its running sum of exponentials as the maximum grows.
    The gradient, g_lse softmax + g_q q + g_target onehot, is one pass too; the largest logit has
    none (it only decides whether a guess is correct)."""
    x = logits.astype(jnp.float32)
    is_target, q = _q(targets, x.shape[-1], label_smoothing)
    operands = (x, jnp.ones_like(x), q * x, jnp.where(is_target, x, 0.0))
    top, exps, q_sum, target = jax.lax.reduce(operands, (-jnp.inf, 0.0, 0.0, 0.0), _combine, (x.ndim - 1,))
    return top + jnp.log(exps), q_sum, target, top


def _logit_reductions_forward(logits, targets, label_smoothing):
    out = logit_reductions(logits, targets, label_smoothing)
    return out, (logits, targets, out[0])


def _logit_reductions_backward(label_smoothing, residuals, cotangents):
    logits, targets, lse = residuals
    g_lse, g_q, g_target, _ = cotangents
    x = logits.astype(jnp.float32)
    is_target, q = _q(targets, x.shape[-1], label_smoothing)
    grad = g_lse[..., None] * jnp.exp(x - lse[..., None]) + g_q[..., None] * q + g_target[..., None] * is_target
    return grad.astype(logits.dtype), None


logit_reductions.defvjp(_logit_reductions_forward, _logit_reductions_backward)


def one_pass_cross_entropy_sums(
    logits: Array, targets: Array, weights: Array, label_smoothing: float
) -> dict[str, Array]:
    """`cross_entropy_sums` from `logit_reductions`: every sum from one pass over the logits
    instead of one reduction per quantity. Chosen by `model.loss_impl=one_pass`; not yet the
    default: on a GPU the passes over [tokens, vocab] cost time, and it is to be measured there."""
    with jax.named_scope("cross_entropy"):
        lse, q_sum, target_logit, top = logit_reductions(logits, targets, label_smoothing)
        smoothed, nll, correct = lse - q_sum, lse - target_logit, (target_logit >= top).astype(jnp.float32)
        sums = (smoothed * weights).sum(), (nll * weights).sum(), (correct * weights).sum(), weights.sum()
    return dict(zip(SUMS, sums, strict=True))


LOSSES = {"reductions": cross_entropy_sums, "one_pass": one_pass_cross_entropy_sums}  # model.loss_impl


def projected_cross_entropy_sums(
    hidden: Array, embedding: Array, targets: Array, weights: Array, label_smoothing: float, dtype
) -> dict[str, Array]:
    """`cross_entropy_sums` of the logits `vocabulary_logits(hidden, embedding, dtype)`, with the
    projection and the reductions in one kernel (`fxformer.kernels.projected_loss`): the logits
    [tokens, vocab] are never written, in the forward pass or the backward. `model.loss_impl=fused`."""
    with jax.named_scope("cross_entropy"):
        lse, q_sum, target_logit, top = projected_loss.projected_reductions(
            hidden, embedding, targets, label_smoothing, dtype
        )
        smoothed, nll, correct = lse - q_sum, lse - target_logit, (target_logit >= top).astype(jnp.float32)
        sums = (smoothed * weights).sum(), (nll * weights).sum(), (correct * weights).sum(), weights.sum()
    return dict(zip(SUMS, sums, strict=True))


def chunked_cross_entropy_sums(
    hidden: Array,
    embedding: Array,
    targets: Array,
    weights: Array,
    label_smoothing: float,
    chunk: int,
    dtype,
    sums_of=cross_entropy_sums,
    bias: Array | None = None,
) -> dict[str, Array]:
    """`cross_entropy_sums` of the logits `vocabulary_logits(hidden, embedding, dtype, bias)`, computed
    `chunk` target tokens at a time: only one chunk's logits [chunk, vocab] exist at once, in the
    forward pass and in the backward pass (which recomputes each chunk's logits for its gradient).

    hidden [..., d_model] is the decoder's output, embedding [vocab, d_model] the shared matrix;
    the same sums as projecting everything at once, up to float32 rounding of their order.
    `sums_of`: one of `LOSSES`, what each chunk's logits are reduced by.
    """
    d_model = hidden.shape[-1]
    hidden, targets, weights = hidden.reshape(-1, d_model), targets.reshape(-1), weights.reshape(-1)
    pad = -targets.shape[0] % chunk  # filler tokens of weight 0
    hidden = jnp.pad(hidden, ((0, pad), (0, 0))).reshape(-1, chunk, d_model)
    targets = jnp.pad(targets, (0, pad), constant_values=PAD_ID).reshape(-1, chunk)
    weights = jnp.pad(weights, (0, pad)).reshape(-1, chunk)

    @jax.checkpoint
    def one_chunk(embedding, bias, hidden, targets, weights):
        return sums_of(vocabulary_logits(hidden, embedding, dtype, bias), targets, weights, label_smoothing)

    def add(sums, chunk_inputs):
        return jax.tree.map(jnp.add, sums, one_chunk(embedding, bias, *chunk_inputs)), None

    zeros = {key: jnp.zeros((), jnp.float32) for key in SUMS}
    sums, _ = jax.lax.scan(add, zeros, (hidden, targets, weights))
    return sums


def target_weights(batch: dict) -> Array:
    """1 for each target token a batch's loss counts, 0 for padding and for rows `example_mask`
    leaves out."""
    weights = (batch["targets"] != PAD_ID).astype(jnp.float32)
    if "example_mask" in batch:
        weights = weights * batch["example_mask"][:, None]
    return weights


def loss_sums(params, batch: dict, model, label_smoothing: float, rng=None, chunk: int = 0) -> dict[str, Array]:
    """Summed label-smoothed loss, NLL and accuracy of a batch, packed (segment ids) or padded;
    dropout on when `rng` is given; `chunk` > 0: the projection and loss `chunk` tokens at a time.
    The sums are taken as the model's `loss_impl` says (`LOSSES`, or "fused": the projection and the
    loss in one kernel, where `chunk` has nothing left to save): the option lives in the model's
    config, so every caller that passes the model gets it with no argument of its own."""
    packed = "inputs_segment_ids" in batch
    fused = model.config.loss_impl == "fused"
    out = model.apply(
        {"params": params},
        batch["inputs"],
        batch["targets"],
        inputs_segmentation=batch["inputs_segment_ids"] if packed else None,
        targets_segmentation=batch["targets_segment_ids"] if packed else None,
        inputs_positions=batch["inputs_positions"] if packed else None,
        targets_positions=batch["targets_positions"] if packed else None,
        deterministic=rng is None,
        project=not (chunk or fused),
        rngs={"dropout": rng} if rng is not None else None,
    )  # logits [b, l, vocab], or with `chunk` the decoder's output [b, l, d_model]
    weights = target_weights(batch)
    if fused:
        embedding = shared_embedding(params)
        return projected_cross_entropy_sums(
            out, embedding, batch["targets"], weights, label_smoothing, model.config.dtype
        )
    sums_of = LOSSES[model.config.loss_impl]
    if chunk:
        embedding = shared_embedding(params)
        return chunked_cross_entropy_sums(
            out,
            embedding,
            batch["targets"],
            weights,
            label_smoothing,
            chunk,
            model.config.dtype,
            sums_of,
            output_bias(params),
        )
    return sums_of(out, batch["targets"], weights, label_smoothing)
