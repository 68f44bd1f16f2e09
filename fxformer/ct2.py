"""A trained run as a CTranslate2 model, built through CTranslate2's model specification
(`ctranslate2.specs.TransformerSpec`), not its transformers converter: that converter drops the
last vocabulary row where it is `<pad>` and starts the decoder from a zero embedding, where an
fxformer run starts it from `<s>`'s learned row.

    python -m fxformer.export --workdir=runs/default --to=ctranslate2 exported-ct2/
    python -m fxformer.export --workdir=runs/default --to=ctranslate2 --quantization=int8 exported-ct2-int8/

What the spec carries, each from the run: its layer norms' epsilon (any: CTranslate2 reads it
from config.json), the feed-forward activation (ReLU, swish, erf GELU), the position table
(fxformer's sinusoids in the run's layout, or the learned rows of row E), sqrt(d_model) scaling
of the embeddings, the one shared embedding (both vocabularies and the output projection), the
output bias if the run has one, and `<s>` as the decoder's start with its own row. The source
gets `</s>` appended by CTranslate2 itself (`add_source_eos`), as fxformer's tokenizer appends it.

The folder holds CTranslate2's model.bin, config.json and shared_vocabulary.json, the run's
SentencePiece model as `tokenizer.model`, and fxformer.json (the run, its steps and decode
section, and the `translate_batch` options that search as fxformer does: `<pad>` and `<s>`
suppressed, fxformer never emitting them). docs/interop.md shows the recipe and what differs
(the length penalty, the length limit).
"""

from __future__ import annotations

import numpy as np

from fxformer.errors import UserError
from fxformer.model import output_bias, sinusoid_table
from fxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

QUANTIZATIONS = ("float32", "int8")


def refusal(model) -> str | None:
    """Why a model with these fields cannot be a CTranslate2 Transformer, in one sentence, or None
    (a Marian model for transformers neither: `export.refusal` begins here)."""
    if model.norm != "post":
        return f"model.norm={model.norm}: the export writes the paper's post-norm layers only."
    if model.d_k * model.num_heads != model.d_model or model.d_v * model.num_heads != model.d_model:
        return f"d_k {model.d_k} and d_v {model.d_v} x {model.num_heads} heads must be d_model {model.d_model}."
    return None


def import_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise UserError(
            "The export to CTranslate2 needs the ctranslate2 package: pip install 'fxformer[export]'."
        ) from None
    return ctranslate2


def _array(x) -> np.ndarray:
    # a copy: CTranslate2's int8 quantization scales the arrays it is given in place
    return np.array(x, dtype=np.float32, copy=True)


def _linear(spec, dense: dict) -> None:
    """A Flax Dense (kernel [in, out]) as a CTranslate2 linear (weight [out, in])."""
    spec.weight = _array(np.asarray(dense["kernel"]).T)
    if "bias" in dense:
        spec.bias = _array(dense["bias"])


def _fused(spec, denses: list[dict]) -> None:
    """Several Dense layers of one input as one linear, their outputs stacked in order."""
    spec.weight = _array(np.concatenate([np.asarray(d["kernel"]).T for d in denses], axis=0))
    if all("bias" in d for d in denses):
        spec.bias = _array(np.concatenate([np.asarray(d["bias"]) for d in denses]))


def _norm(spec, p: dict) -> None:
    spec.gamma, spec.beta = _array(p["scale"]), _array(p["bias"])


def _attention(spec, p: dict, norm: dict, self_attention: bool) -> None:
    """Self-attention: linear[0] = [W^Q; W^K; W^V]; cross-attention: linear[0] = W^Q, linear[1] =
    [W^K; W^V]; the output projection last; the layer norm after the residual (post-norm)."""
    q, k, v = (p[name] for name in ("query", "key", "value"))
    if self_attention:
        _fused(spec.linear[0], [q, k, v])
    else:
        _fused(spec.linear[0], [q])
        _fused(spec.linear[1], [k, v])
    _linear(spec.linear[-1], p["out"])
    _norm(spec.layer_norm, norm)


def _feed_forward(spec, p: dict) -> None:
    _linear(spec.linear_0, p["feed_forward"]["hidden"])
    _linear(spec.linear_1, p["feed_forward"]["output"])
    _norm(spec.layer_norm, p["feed_forward_norm"])


SINUSOID_ROWS = 1026  # CTranslate2's default max_input_length (1024), its </s> and the decoder's start


def positions(model, params: dict, stack: str) -> np.ndarray:
    """The position table the `stack` adds to its embeddings: row E's learned rows [max_len,
    d_model], or the sinusoids, to at least `SINUSOID_ROWS` rows (the same formula past max_len,
    so that CTranslate2's default limits never reach past the table)."""
    if model.positional == "learned":
        return _array(params[stack]["positional"]["embedding"])
    return sinusoid_table(max(model.max_len, SINUSOID_ROWS), model.d_model, model.sinusoid_layout)


def spec_of(model, params: dict, pieces: list[str]):
    """The `TransformerSpec` of a run's model fields (`config.model`) and parameters (NumPy), its
    vocabulary `pieces` in id order."""
    import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    activation = {
        "relu": common_spec.Activation.RELU,
        "swish": common_spec.Activation.SWISH,
        "gelu": common_spec.Activation.GELU,  # erf's, as fxformer's
    }[model.activation]
    spec = transformer_spec.TransformerSpec.from_config(
        (model.num_layers, model.num_layers), model.num_heads, pre_norm=False, activation=activation
    )
    embedding = _array(params["embed"]["embedding"])
    for stack in ("encoder", "decoder"):
        side = getattr(spec, stack)
        side.scale_embeddings = bool(model.scale_embedding)
        side.position_encodings.encodings = positions(model, params, stack)
        for i, layer in enumerate(side.layer):
            p = params[stack][f"layer_{i}"]
            _attention(layer.self_attention, p["self_attention"], p["self_attention_norm"], True)
            if stack == "decoder":
                _attention(layer.attention, p["cross_attention"], p["cross_attention_norm"], False)
            _feed_forward(layer.ffn, p)
    spec.encoder.embeddings[0].weight = embedding
    spec.decoder.embeddings.weight = _array(embedding)
    spec.decoder.start_from_zero_embedding = False  # <s> starts the decoder with its learned row
    spec.decoder.projection.weight = _array(embedding)
    bias = output_bias(params)
    if bias is not None:
        spec.decoder.projection.bias = _array(bias)
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    c = spec.config
    c.unk_token, c.bos_token, c.eos_token = pieces[UNK_ID], pieces[BOS_ID], pieces[EOS_ID]
    c.decoder_start_token = pieces[BOS_ID]
    c.add_source_bos, c.add_source_eos = False, True
    c.layer_norm_epsilon = float(model.layer_norm_epsilon)
    return spec


def translate_options(config, pieces: list[str]) -> dict:
    """`translate_batch`'s options that search as the run's decode section does, as near as
    CTranslate2 has them: its beam, `<pad>` and `<s>` never emitted, GNMT's alpha as the nearest
    plain length power (CTranslate2 divides by |Y|^length_penalty), and the model's position limit
    for the source and the translation (fxformer's translation limit is the source's length +
    max_extra)."""
    d = config.decode
    return {
        "beam_size": d.beam_size if d.strategy == "beam" else 1,
        "length_penalty": float(d.alpha),
        "suppress_sequences": [[pieces[PAD_ID]], [pieces[BOS_ID]]],
        "max_input_length": int(config.model.max_len) - 1,
        "max_decoding_length": int(config.model.max_len) - 1,
        "min_decoding_length": 0,
    }


def write(model, params: dict, pieces: list[str], out, quantization: str = "float32") -> None:
    """CTranslate2's files of a model at `out` (a directory that exists)."""
    if quantization not in QUANTIZATIONS:
        raise UserError(f"--quantization is one of {', '.join(QUANTIZATIONS)}, not {quantization!r}.")
    spec = spec_of(model, params, pieces)
    spec.validate()
    spec.optimize(quantization=None if quantization == "float32" else quantization)
    spec.save(str(out))


__all__ = ["QUANTIZATIONS", "refusal", "spec_of", "translate_options", "write"]
