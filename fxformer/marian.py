"""Marian (OPUS-MT) models as transformers writes them (`save_pretrained`), read into fxformer.

A Marian model is the paper's Transformer with differences fxformer represents as named model
options (docs/interop.md): sines and cosines in halves (`model.sinusoid_layout=halves`), swish or
the exact GELU (`model.activation`), biases on the attention projections (`model.attention_bias`)
and on the logits (`model.output_bias`), LayerNorm's epsilon 1e-5 (`model.layer_norm_epsilon`).

The ids differ too: Marian has `</s>`, `<unk>` and `<pad>` where it likes (`<pad>` last in the
OPUS-MT models) and starts the decoder from `<pad>`; fxformer's are fixed (pad 0, unk 1, bos 2,
eos 3, `fxformer.tokens`). The import reorders the vocabulary's rows, an exact permutation:
fxformer's row i is Marian's row `rows[i]`, the special rows first, the rest in Marian's order.
Where the decoder starts from `<pad>`, fxformer's bos row is a copy of the pad row whose logit is
lowered by `ABSENT` (30: its probability is at most e^-30, 1e-13, of the pad row's, below what a
float32 sum resolves), so the softmax spans Marian's vocabulary once. A finite margin, not minus
infinity: fine-tuning smooths its labels over every row, this one included, as it does for
fxformer's own pad and bos rows, and the loss stays finite.

Weights are read with safetensors into NumPy, never through a pickle (`pytorch_model.bin` runs code
when loaded: it is refused, with the fix).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import sentencepiece as spm

from fxformer.errors import UserError
from fxformer.tokens import BOS_ID, EOS_ID, UNK_ID, text_ids

ABSENT = -30.0  # the bos row's logit, below the pad row's it copies: e^-30 of its probability
FILES = ("config.json", "model.safetensors", "source.spm", "target.spm", "vocab.json")
TOKENIZER_FILES = ("config.json", "source.spm", "target.spm", "vocab.json")  # a fine-tuned run keeps them
PICKLES = ("pytorch_model.bin", "model.pt", "model.ckpt")
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}  # transformers' name -> ours
NEEDED = (  # config.json fields the import reads
    *("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads"),
    *("encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "max_position_embeddings", "activation_function"),
    *("pad_token_id", "eos_token_id", "decoder_start_token_id"),
)


def is_marian(path) -> bool:
    """Whether `path` is a directory transformers wrote for a Marian model (its config.json says so)."""
    config = Path(path) / "config.json"
    try:
        return Path(path).is_dir() and json.loads(config.read_text()).get("model_type") == "marian"
    except (OSError, ValueError, AttributeError):
        return False


def read_config(path: Path) -> dict:
    """config.json of a Marian directory, refused in one sentence if fxformer cannot represent it."""
    hf = json.loads((path / "config.json").read_text())
    missing = [f for f in NEEDED if f not in hf]
    if missing:
        raise UserError(f"{path / 'config.json'} has no {missing[0]}, which the import needs; is it a Marian config?")
    pairs = [("encoder_layers", "decoder_layers"), ("encoder_attention_heads", "decoder_attention_heads")]
    pairs += [("encoder_ffn_dim", "decoder_ffn_dim")]
    for a, b in pairs:
        if hf[a] != hf[b]:
            raise UserError(f"{path.name}: {a} {hf[a]} and {b} {hf[b]} differ; fxformer's stacks are alike.")
    if hf.get("decoder_vocab_size") not in (None, hf["vocab_size"]) or (path / "target_vocab.json").exists():
        raise UserError(f"{path.name} has separate source and target vocabularies; fxformer shares one.")
    if hf.get("share_encoder_decoder_embeddings", True) is False:
        raise UserError(f"{path.name}: share_encoder_decoder_embeddings is false; fxformer shares one embedding.")
    if hf["activation_function"] not in ACTIVATIONS:
        raise UserError(
            f"{path.name}: activation_function {hf['activation_function']!r} is not one of relu, swish, gelu."
        )
    if hf.get("normalize_before") or hf.get("add_final_layer_norm") or hf.get("normalize_embedding"):
        raise UserError(f"{path.name} normalises before its sub-layers or its embeddings; fxformer reads post-norm.")
    if hf["d_model"] % hf["encoder_attention_heads"]:
        raise UserError(f"{path.name}: d_model {hf['d_model']} is not a multiple of its heads.")
    return hf


def model_fields(hf: dict, vocab_size: int, output_bias: bool) -> dict:
    """The fxformer `model` section's fields of a Marian config."""
    return {
        "num_layers": hf["encoder_layers"],
        "d_model": hf["d_model"],
        "d_ff": hf["encoder_ffn_dim"],
        "num_heads": hf["encoder_attention_heads"],
        "d_k": hf["d_model"] // hf["encoder_attention_heads"],
        "d_v": hf["d_model"] // hf["encoder_attention_heads"],
        "dropout_rate": float(hf.get("dropout", 0.1)),
        "attention_dropout_rate": float(hf.get("attention_dropout", 0.0)),
        "relu_dropout_rate": float(hf.get("activation_dropout", 0.0)),
        "positional": "sinusoidal",
        "sinusoid_layout": "halves",
        "max_len": hf["max_position_embeddings"],
        "norm": "post",
        "attention_bias": True,
        "activation": ACTIVATIONS[hf["activation_function"]],
        "layer_norm_epsilon": 1e-5,  # fixed in transformers' Marian layers (torch's LayerNorm default)
        "output_bias": output_bias,
        "scale_embedding": bool(hf.get("scale_embedding", False)),
    }


def layers_and_heads(path: Path) -> tuple[int, int]:
    """(layers, heads a layer) of the Marian model at `path`, from its config.json alone."""
    hf = read_config(path)
    return hf["encoder_layers"], hf["encoder_attention_heads"]


def special_rows(hf: dict, vocab: dict[str, int]) -> tuple[np.ndarray, bool]:
    """(rows, absent): fxformer's row i is Marian's row rows[i]; `absent` when fxformer's bos row is
    a copy of Marian's pad row (the decoder starts from `<pad>`)."""
    if "<unk>" not in vocab:
        raise UserError("vocab.json has no <unk>; is it a Marian vocabulary?")
    pad, eos, start, unk = hf["pad_token_id"], hf["eos_token_id"], hf["decoder_start_token_id"], vocab["<unk>"]
    specials = [pad, unk, start, eos]
    if len({pad, unk, eos}) < 3 or start in (unk, eos):
        raise UserError(f"config.json's pad {pad}, eos {eos}, decoder start {start} and <unk> {unk} overlap.")
    rest = [i for i in range(hf["vocab_size"]) if i not in specials]
    return np.asarray(specials + rest, np.int64), start == pad


class MarianTokenizer:
    """Text <-> fxformer ids through a Marian directory's two SentencePiece models and vocab.json
    (pieces -> Marian ids -> fxformer's rows); `encode_source` and `encode_target` append EOS.
    A leading `>>xx<<` target-language token stays one token, as transformers keeps it."""

    def __init__(self, path, rows: np.ndarray):
        self.path = path  # read through its path object: a gs:// workdir's copy works too
        source, target, vocab = ((path / f).read_bytes() for f in TOKENIZER_FILES[1:])
        self.source_sp = spm.SentencePieceProcessor(model_proto=source)
        self.target_sp = spm.SentencePieceProcessor(model_proto=target)
        self.proto = source + target + vocab  # what names the stored token ids (`fxformer.data.tokenized`)
        vocab = json.loads(vocab)
        ours = np.empty(max(len(vocab), int(rows.max()) + 1), np.int64)
        ours[rows[::-1]] = np.arange(len(rows))[::-1]  # a duplicated Marian row maps to its first fxformer id
        self.ids = {piece: int(ours[i]) for piece, i in vocab.items()}
        self.pieces = {fx: piece for piece, fx in self.ids.items()}
        self.vocab_size = len(rows)

    def _encode(self, sp, text: str) -> list[int]:
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        pieces = code + sp.encode(text, out_type=str)
        return [self.ids.get(p, UNK_ID) for p in pieces] + [EOS_ID]

    def encode_source(self, text: str) -> np.ndarray:
        return np.asarray(self._encode(self.source_sp, text), np.int32)

    def encode_target(self, text: str) -> np.ndarray:
        return np.asarray(self._encode(self.target_sp, text), np.int32)

    def encode_many(self, texts: list[str], side: str) -> list[list[int]]:
        """Texts of one side ("inputs": sources, "targets": targets) -> id lists ending in EOS."""
        sp = self.source_sp if side == "inputs" else self.target_sp
        return [self._encode(sp, text) for text in texts]

    def piece(self, i: int) -> str:
        return "<s>" if i == BOS_ID else self.pieces.get(int(i), "<unk>")

    def vocabulary(self) -> list[str]:
        """Every id's wordpiece, in the order of the ids."""
        return [self.piece(i) for i in range(self.vocab_size)]

    def decode(self, ids) -> str:
        """Ids -> text as transformers' `decode(ids, skip_special_tokens=True)` gives it: the target
        model's pieces up to the first EOS, without pad, bos and unk; a piece the target model lacks
        (both sides share the vocabulary) is kept as its text, each '▁' a space."""
        pieces = [self.pieces[i] for i in text_ids(ids) if i != UNK_ID and i in self.pieces]
        return self.target_sp.decode_pieces(pieces).replace("\u2581", " ").strip()


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """model.safetensors as float32 NumPy arrays (bfloat16 through ml_dtypes), never a pickle."""
    file = path / "model.safetensors"
    if not file.exists():
        pickle = next((p for p in PICKLES if (path / p).exists()), None)
        if pickle:
            raise UserError(
                f"{path / pickle} is a pickle, which runs code when loaded: save the model with transformers "
                "as safetensors (model.save_pretrained(dir, safe_serialization=True)) and import that."
            )
        raise UserError(f"{path} has no model.safetensors.")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{file} is unreadable ({str(e).splitlines()[0][:80]}); download it again.") from None
    return {name.removeprefix("model."): np.asarray(t, np.float32) for name, t in tensors.items()}


def dense(w: dict, name: str) -> dict:
    """A torch Linear (weight [out, in], bias [out]) as a Flax Dense (kernel [in, out], bias)."""
    return {"kernel": w[f"{name}.weight"].T, "bias": w[f"{name}.bias"]}


def norm(w: dict, name: str) -> dict:
    return {"scale": w[f"{name}.weight"], "bias": w[f"{name}.bias"]}


def attention(w: dict, prefix: str) -> dict:
    names = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "out_proj"}
    return {ours: dense(w, f"{prefix}.{theirs}") for ours, theirs in names.items()}


def layer(w: dict, prefix: str, decoder: bool) -> dict:
    out = {
        "self_attention": attention(w, f"{prefix}.self_attn"),
        "self_attention_norm": norm(w, f"{prefix}.self_attn_layer_norm"),
        "feed_forward": {"hidden": dense(w, f"{prefix}.fc1"), "output": dense(w, f"{prefix}.fc2")},
        "feed_forward_norm": norm(w, f"{prefix}.final_layer_norm"),
    }
    if decoder:
        out["cross_attention"] = attention(w, f"{prefix}.encoder_attn")
        out["cross_attention_norm"] = norm(w, f"{prefix}.encoder_attn_layer_norm")
    return out


def params_of(w: dict, hf: dict, rows: np.ndarray, absent: bool) -> tuple[dict, bool]:
    """fxformer's parameter tree of Marian's weights `w` (names without "model."), and whether it
    has an output bias (an all-zero final_logits_bias without an absent row is left out)."""
    shared = w.get("shared.weight", w.get("encoder.embed_tokens.weight"))
    if shared is None or shared.shape != (hf["vocab_size"], hf["d_model"]):
        raise UserError(f"model.safetensors has no shared embedding of [{hf['vocab_size']}, {hf['d_model']}].")
    bias = w.get("final_logits_bias", np.zeros((1, hf["vocab_size"]), np.float32)).reshape(-1)[rows].copy()
    if absent:
        bias[BOS_ID] += ABSENT
    embed = {"embedding": shared[rows]}
    with_bias = absent or bool(np.any(bias))
    if with_bias:
        embed["output_bias"] = bias
    n = hf["encoder_layers"]
    try:
        params = {
            "embed": embed,
            "encoder": {f"layer_{i}": layer(w, f"encoder.layers.{i}", False) for i in range(n)},
            "decoder": {f"layer_{i}": layer(w, f"decoder.layers.{i}", True) for i in range(n)},
        }
    except KeyError as e:
        raise UserError(f"model.safetensors has no {e.args[0]}; is it a Marian model of this config?") from None
    return params, with_bias


def check_files(path: Path) -> None:
    if not path.is_dir():
        raise UserError(f"{path} is not a directory.")
    missing = [f for f in FILES if not (path / f).exists() and f != "model.safetensors"]
    if missing:
        raise UserError(
            f"{path} has no {missing[0]}: a Marian directory written by transformers' save_pretrained has it."
        )


def embedding_size_check(path: Path, vocab: dict, hf: dict) -> None:
    if len(vocab) != hf["vocab_size"]:
        raise UserError(
            f"{path / 'vocab.json'} holds {len(vocab):,} pieces, config.json's vocab_size is {hf['vocab_size']:,}: "
            "they belong to different models."
        )


def read_tokenizer(path) -> MarianTokenizer:
    """The tokenizer of a Marian directory, or of the copy of its tokenizer files in a workdir
    (`W/marian/`): local or a URL."""
    hf = json.loads((path / "config.json").read_text())
    vocab = json.loads((path / "vocab.json").read_text())
    return MarianTokenizer(path, special_rows(hf, vocab)[0])


def read(path) -> tuple[dict, dict, MarianTokenizer]:
    """(model fields, parameters, tokenizer) of a Marian directory, each refused in one sentence
    where fxformer cannot represent it."""
    path = Path(path)
    check_files(path)
    hf = read_config(path)
    vocab = json.loads((path / "vocab.json").read_text())
    embedding_size_check(path, vocab, hf)
    rows, absent = special_rows(hf, vocab)
    params, with_bias = params_of(read_weights(path), hf, rows, absent)
    fields = model_fields(hf, len(rows), with_bias)
    return fields, params, MarianTokenizer(path, rows)
