"""Export a trained run as a Marian directory that transformers reads (`MarianMTModel` and
`MarianTokenizer.from_pretrained`), the inverse of the import (`fxformer.marian`, docs/interop.md),
or as a CTranslate2 model (`fxformer.ct2`; `pip install 'fxformer[export]'`).

    python -m fxformer.export --workdir=runs/default --to=transformers exported/
    python -m fxformer.export --workdir=runs/base --average_last=5 --to=transformers exported/
    python -m fxformer.export --workdir=runs/default --to=ctranslate2 --quantization=int8 exported-ct2/

A folder that is not empty is replaced only with `--overwrite`. For transformers:

Writes config.json, generation_config.json, model.safetensors, source.spm and target.spm (the
run's one SentencePiece model, as both), vocab.json, tokenizer_config.json and
special_tokens_map.json. fxformer's ids and rows are kept (pad 0, unk 1, bos 2 as the decoder's
start, eos 3: config.json and vocab.json name them), so the export's weights are the run's.
Sinusoids interleaved (the paper's layout) are exported exactly: the model's d_model features are
reordered, sines first and cosines after, as transformers' Marian lays them out; every layer
norm, projection and the embedding are reordered alike, which changes no output. Refused in one
sentence: pre-norm, learned positions, d_k or d_v other than d_model / h, and a layer norm
epsilon other than 1e-5 (fixed in transformers' Marian layers) unless `--allow_epsilon_change`,
which prints the largest per-token log-probability change it measures on the dev split.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jax
import numpy as np

from fxformer import api, cli, ct2, evaluation, inferflags, parallel, paths, trainstate
from fxformer.data import pipeline
from fxformer.errors import UserError
from fxformer.model import output_bias
from fxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

MARIAN_EPSILON = 1e-5  # transformers' Marian layers use torch's LayerNorm default


def refusal(model, allow_epsilon_change: bool = False) -> str | None:
    """Why a model with these fields cannot be a Marian model, in one sentence, or None: what
    CTranslate2 refuses too (`ct2.refusal`), learned positions, and another epsilon than 1e-5."""
    if problem := ct2.refusal(model):
        return problem
    if model.positional != "sinusoidal":
        return f"model.positional={model.positional}: transformers' Marian has sinusoids, no learned positions."
    if model.layer_norm_epsilon != MARIAN_EPSILON and not allow_epsilon_change:
        return (
            f"model.layer_norm_epsilon is {model.layer_norm_epsilon:g} and transformers' Marian fixes it at 1e-5: "
            "give --allow_epsilon_change to export anyway, or train with --config.model.layer_norm_epsilon=1e-5."
        )
    return None


def feature_order(d_model: int, layout: str) -> np.ndarray:
    """The order of the d_model features in the export: transformers' sines-then-cosines (`halves`)
    from fxformer's `layout`; interleaved (sin, cos, sin, cos, ...) -> its even features, then odd."""
    if layout == "halves":
        return np.arange(d_model)
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def linear(dense: dict, order_in=None, order_out=None) -> dict:
    """A Flax Dense (kernel [in, out], optional bias) as torch's Linear (weight [out, in], bias
    [out]), its input and output features reordered where they are the model's d_model features."""
    kernel = np.asarray(dense["kernel"], np.float32)
    bias = np.asarray(dense["bias"], np.float32) if "bias" in dense else np.zeros(kernel.shape[1], np.float32)
    if order_in is not None:
        kernel = kernel[order_in]
    if order_out is not None:
        kernel, bias = kernel[:, order_out], bias[order_out]
    return {"weight": kernel.T.copy(), "bias": bias.copy()}


def tensors_of(params, order: np.ndarray, decoder_layers: int, encoder_layers: int) -> dict[str, np.ndarray]:
    """model.safetensors' tensors of fxformer parameters, with the features in `order`."""
    out = {}

    def put(name: str, tensors: dict) -> None:
        out.update({f"{name}.{key}": value for key, value in tensors.items()})

    def attention(name: str, p: dict) -> None:
        for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            put(f"{name}.{theirs}", linear(p[ours], order_in=order))
        put(f"{name}.out_proj", linear(p["out"], order_out=order))

    def norm(name: str, p: dict) -> None:
        put(
            name,
            {"weight": np.asarray(p["scale"], np.float32)[order], "bias": np.asarray(p["bias"], np.float32)[order]},
        )

    for stack, count in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        for i in range(count):
            p, name = params[stack][f"layer_{i}"], f"model.{stack}.layers.{i}"
            attention(f"{name}.self_attn", p["self_attention"])
            norm(f"{name}.self_attn_layer_norm", p["self_attention_norm"])
            if stack == "decoder":
                attention(f"{name}.encoder_attn", p["cross_attention"])
                norm(f"{name}.encoder_attn_layer_norm", p["cross_attention_norm"])
            put(f"{name}.fc1", linear(p["feed_forward"]["hidden"], order_in=order))
            put(f"{name}.fc2", linear(p["feed_forward"]["output"], order_out=order))
            norm(f"{name}.final_layer_norm", p["feed_forward_norm"])
    embedding = np.asarray(params["embed"]["embedding"], np.float32)[:, order]
    out["model.shared.weight"] = embedding.copy()
    bias = output_bias(params)
    out["final_logits_bias"] = (np.zeros(len(embedding), np.float32) if bias is None else np.asarray(bias, np.float32))[
        None
    ].copy()
    return out


def marian_config(config, vocab_size: int) -> dict:
    """config.json of the export: the run's model, fxformer's special ids."""
    m = config.model
    activation = {"relu": "relu", "swish": "swish", "gelu": "gelu"}[m.activation]
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": vocab_size,
        "decoder_vocab_size": vocab_size,
        "share_encoder_decoder_embeddings": True,
        "d_model": m.d_model,
        "encoder_layers": m.num_layers,
        "decoder_layers": m.num_layers,
        "encoder_attention_heads": m.num_heads,
        "decoder_attention_heads": m.num_heads,
        "encoder_ffn_dim": m.d_ff,
        "decoder_ffn_dim": m.d_ff,
        "max_position_embeddings": m.max_len,
        "activation_function": activation,
        "dropout": m.dropout_rate,
        "attention_dropout": m.attention_dropout_rate,
        "activation_dropout": m.relu_dropout_rate,
        "scale_embedding": bool(m.scale_embedding),
        "normalize_before": False,
        "static_position_embeddings": True,
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
        "bos_token_id": BOS_ID,
        "decoder_start_token_id": BOS_ID,
        "forced_eos_token_id": None,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
    }


def generation_config(config) -> dict:
    """generation_config.json: the run's beam, the ids fxformer never emits barred, no forced EOS;
    the length penalty and the length limit as near as transformers' can be (docs/interop.md)."""
    d = config.decode
    return {
        "decoder_start_token_id": BOS_ID,
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
        "bos_token_id": BOS_ID,
        "forced_eos_token_id": None,
        "num_beams": d.beam_size if d.strategy == "beam" else 1,
        "length_penalty": d.alpha,
        "bad_words_ids": [[PAD_ID], [BOS_ID]],
        "max_length": config.model.max_len,
    }


def write(run: api.TrainedRun, out: Path) -> None:
    """The Marian directory of a restored run at `out` (made; its files replaced)."""
    config, tokenizer = run.config, run.tokenizer
    order = feature_order(config.model.d_model, config.model.sinusoid_layout)
    params = jax.device_get(run.params)
    tensors = tensors_of(params, order, config.model.num_layers, config.model.num_layers)
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    vocab = {piece: i for i, piece in enumerate(tokenizer.vocabulary())}
    specials = {
        "unk_token": tokenizer.piece(UNK_ID),
        "eos_token": tokenizer.piece(EOS_ID),
        "pad_token": tokenizer.piece(PAD_ID),
        "bos_token": tokenizer.piece(BOS_ID),  # the decoder's start: skipped in decoded text
    }
    files = {
        "config.json": marian_config(config, tokenizer.vocab_size),
        "generation_config.json": generation_config(config),
        "vocab.json": vocab,
        "special_tokens_map.json": specials,
        "tokenizer_config.json": {
            **specials,
            "tokenizer_class": "MarianTokenizer",
            "model_max_length": config.model.max_len,
            "separate_vocabs": False,
            "source_lang": config.data.source_lang,
            "target_lang": config.data.target_lang,
        },
    }
    for name, content in files.items():
        paths.write_atomic(out / name, json.dumps(content, indent=2, ensure_ascii=False) + "\n")
    for name in ("source.spm", "target.spm"):
        paths.write_atomic(out / name, tokenizer.proto)


def epsilon_change(run: api.TrainedRun, sentences: int = 100) -> float:
    """The largest change of a per-token log-probability over the first `sentences` pairs of the
    run's dev split (teacher-forced) when its layer norms' epsilon becomes Marian's 1e-5."""
    config = run.config.copy_and_resolve_references()
    config.model.layer_norm_epsilon = MARIAN_EPSILON
    marian = trainstate.model_of(config, run.tokenizer.vocab_size)
    test = evaluation.split_test_set(run.config, run.config.data.eval_split, sentences, log=lambda *a: None)
    examples = pipeline.tokenize_pairs(run.tokenizer, test.sources, test.references)
    length = pipeline.eval_length(examples, run.restored.model.config.max_len)
    trained, changed = (api.token_log_probs(m) for m in (run.restored.model, marian))
    largest = 0.0
    for batch in pipeline.eval_batches(examples, parallel.round_to_devices(config.data.eval_batch_size), length):
        a, b = (jax.device_get(f(run.params, batch["inputs"], batch["targets"])) for f in (trained, changed))
        largest = max(largest, float(np.abs((a - b)[batch["targets"] != PAD_ID]).max(initial=0.0)))
    return largest


def write_ctranslate2(run: api.TrainedRun, out: Path, quantization: str) -> None:
    """CTranslate2's model of a restored run at `out` (made), its tokenizer and fxformer.json beside it."""
    pieces = run.tokenizer.vocabulary()
    out.mkdir(parents=True, exist_ok=True)
    ct2.write(run.config.model, jax.device_get(run.params), pieces, out, quantization)
    paths.write_atomic(out / "tokenizer.model", run.tokenizer.proto)
    about = {
        "workdir": str(run.workdir.root) if run.workdir else None,
        "steps": run.steps,
        "quantization": quantization,
        "decode": run.config.decode.to_dict(),
        "translate_batch": ct2.translate_options(run.config, pieces),
    }
    paths.write_atomic(out / "fxformer.json", json.dumps(about, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    p = inferflags.parser(__doc__, "fxformer.export")
    p.add_argument(
        "--to",
        required=True,
        choices=("transformers", "ctranslate2"),
        help="the format: transformers' Marian directory, or a CTranslate2 model directory",
    )
    p.add_argument("out", help="the directory to write (made if absent)")
    p.add_argument(
        "--allow_epsilon_change",
        action="store_true",
        help="transformers: export a run trained with another layer norm epsilon than Marian's 1e-5 "
        "(prints the largest log-probability change it measured on the dev split)",
    )
    p.add_argument(
        "--quantization",
        default="float32",
        choices=ct2.QUANTIZATIONS,
        help="ctranslate2: the weights' type (int8: about a quarter of the size, faster on a CPU)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the files of an export folder that is not empty")
    args = inferflags.parse(p)
    workdir = cli.workdir(args.workdir)
    from fxformer.config import load_workdir_config

    model = load_workdir_config(workdir).model
    if args.to == "transformers":
        problem = refusal(model, args.allow_epsilon_change)
        if args.quantization != "float32":
            problem = f"--quantization={args.quantization} is CTranslate2's: transformers' export is float32."
    else:
        problem = ct2.refusal(model)
        ct2.import_ctranslate2()  # installed, or one sentence before any work
    if problem:
        raise UserError(f"{workdir} cannot be exported to {args.to}: {problem}")
    out = Path(os.path.expanduser(args.out))
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise UserError(f"{out} is not empty: give --overwrite to replace its files, or name a new folder.")
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is a file: name a folder to export to.")
    paths.check_writable(out, "the export is written")
    run = api.load(workdir, args.step, args.average_last, log=cli.log_to_stderr)
    if args.to == "ctranslate2":
        write_ctranslate2(run, out, args.quantization)
        print(f"exported {workdir} (checkpoint step(s) {run.steps}) to {out}: ctranslate2.Translator({str(out)!r})")
        return
    if model.layer_norm_epsilon != MARIAN_EPSILON:
        change = epsilon_change(run)
        print(
            f"layer norm epsilon {model.layer_norm_epsilon:g} -> 1e-5: per-token log-probabilities on the first 100 "
            f"dev pairs change by at most {change:.3g}",
            file=sys.stderr,
        )
    write(run, out)
    print(f"exported {workdir} (checkpoint step(s) {run.steps}) to {out}: MarianMTModel.from_pretrained({str(out)!r})")


if __name__ == "__main__":
    cli.run(main)
