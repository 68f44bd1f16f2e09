"""A run's config in one place (its fields and their defaults are fxformer/schema.py's): dotted keys,
the fields derived from others, `upgrade` (a config.json written by older code, as today's code
reads it), `check_fields` (every key known, every value of its field's type) and `validate`
(every check of a config, each refusal one sentence), `DecodeOptions` (the `decode` section as
the searches take it), and the resolved config a run records in its workdir (`W/config.json`:
read and checked by every command, written, compared on resume). Imports no JAX (the launcher
and the sweeps use it).

A new field is one line in fxformer/schema.py, plus, if some of its values cannot run, one check
in `validate`.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import math
import time
from typing import Any, ClassVar

import ml_collections

from fxformer import paths, schema
from fxformer.errors import UserError

# ---------------------------------------------------------------------------------------------
# Dotted keys: `model.d_model` names config["model"]["d_model"] (a ConfigDict or its dict)


def _is_section(node) -> bool:
    return isinstance(node, (dict, ml_collections.ConfigDict))


def walk(config, key: str) -> tuple[Any, str]:
    """(the section that holds the dotted `key`, the key's last name); an unknown key is refused
    in one sentence that names the closest known one."""
    *sections, leaf = key.split(".")
    node = config
    for name in sections:
        node = node[name] if _is_section(node) and name in node else None
    if not _is_section(node) or leaf not in node:
        close = difflib.get_close_matches(key, dotted_keys(config, sections=True), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UserError(f"Unknown config key '{key}'{hint}.")
    return node, leaf


def lookup(config, key: str) -> Any:
    """The value of the dotted `key` of `config`."""
    node, leaf = walk(config, key)
    return node[leaf]


def with_overrides(config: ml_collections.ConfigDict, overrides: dict) -> ml_collections.ConfigDict:
    """Set dotted keys (`"model.d_model": 1024`) of `config`; every key must already exist."""
    for key, value in overrides.items():
        node, leaf = walk(config, key)
        node[leaf] = value
    return config


def dotted_keys(config, prefix: str = "", sections: bool = False) -> list[str]:
    """Every field's dotted key (with `sections`, each section's key before its fields')."""
    keys = []
    for name, value in config.items():
        if _is_section(value):
            keys += ([prefix + name] if sections else []) + dotted_keys(value, f"{prefix}{name}.", sections)
        else:
            keys.append(prefix + name)
    return keys


# ---------------------------------------------------------------------------------------------
# Derived fields


def head_width(d_model: int, num_heads: int, key: str) -> int:
    """What `model.d_k` / `model.d_v` of 0 mean: d_model / h, the paper's choice (refused when h
    does not divide d_model; 0 while h is not positive, which `validate` refuses)."""
    if num_heads > 0 and d_model % num_heads:
        raise UserError(
            f"model.d_model ({d_model}) is not divisible by model.num_heads ({num_heads}); set model.{key} explicitly."
        )
    return d_model // num_heads if num_heads > 0 else 0


def head_widths(model: ml_collections.ConfigDict) -> tuple[int, int]:
    """(d_k, d_v) of a `model` section, 0 meaning d_model / h (`head_width`)."""
    d_k, d_v = (model[key] or head_width(model.d_model, model.num_heads, key) for key in ("d_k", "d_v"))
    return d_k, d_v


def resolve_derived(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Fill fields derived from others, after the overrides: `model.d_k` / `model.d_v` of 0 become
    d_model / h, so changing d_model or h changes the heads' width unless d_k / d_v are set."""
    model = config.model if "model" in config else {}
    if all(k in model for k in ("d_k", "d_v", "d_model", "num_heads")):
        model.d_k, model.d_v = head_widths(model)
    return config


# ---------------------------------------------------------------------------------------------
# Older configs


# Fields older code wrote under other names: its dotted key -> today's.
RENAMED = {"beam_size": "decode.beam_size", "alpha": "decode.alpha", "max_decode_extra": "decode.max_extra"}


def upgrade(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A config written by older code (a workdir's config.json), as today's code reads it: fields
    it names otherwise (`RENAMED`) moved to today's names, and every field it lacks filled with
    fxformer/schema.py's default; the fields it has keep their values."""
    old = config.to_dict()
    renamed = {now: old.pop(before) for before, now in RENAMED.items() if before in old}
    upgraded = _filled(old, schema.defaults().to_dict())
    for key, value in renamed.items():
        if key not in dotted_keys(old):  # not written under today's name too
            node, leaf = walk(upgraded, key)
            node[leaf] = value
    return ml_collections.ConfigDict(upgraded)


def downgrade(config: dict, known: dict) -> dict:
    """`upgrade`'s inverse: a config of today's fields (a record's `config`) as older code wrote it,
    given that code's defaults (its `schema.defaults().to_dict()`), so that it can read it again:
    fields it names otherwise (`RENAMED`) under its names, and only the fields it knows. A field it
    lacks is dropped only at today's default, which `upgrade` fills in again; any other value is
    refused (that code cannot train it)."""
    today, old_keys = schema.defaults().to_dict(), set(dotted_keys(known))
    config = json.loads(json.dumps(config))  # a copy
    for before, now in RENAMED.items():
        if before in old_keys and now not in old_keys and now in dotted_keys(config):
            node, leaf = walk(config, now)
            *sections, name = before.split(".")
            target = config
            for section in sections:
                target = target.setdefault(section, {})
            target[name] = node.pop(leaf)
    return _kept(config, known, today, "")


def _kept(config: dict, known: dict, today: dict, prefix: str) -> dict:
    out = {}
    for key, value in config.items():
        if key in known:
            nested = isinstance(known[key], dict) and isinstance(value, dict)
            out[key] = _kept(value, known[key], today.get(key, {}), f"{prefix}{key}.") if nested else value
        elif key not in today or not _at_default(value, today[key]):
            raise UserError(f"{prefix}{key}={value!r} is not today's default, and the older code has no such field.")
    return out


def _at_default(value, default) -> bool:
    """Every field of `value` (a section: those left after `RENAMED` moved some out) at its default."""
    if isinstance(value, dict) and isinstance(default, dict):
        return all(key in default and _at_default(v, default[key]) for key, v in value.items())
    return value == default


def _filled(config: dict, defaults: dict) -> dict:
    """`config` with every key of `defaults` it lacks (in sections too) set to the default."""
    out = dict(config)
    for key, default in defaults.items():
        if key not in out:
            out[key] = default
        elif isinstance(default, dict) and isinstance(out[key], dict):
            out[key] = _filled(out[key], default)
    return out


# ---------------------------------------------------------------------------------------------
# Field types: a value read from JSON takes its field's type, as a command-line override does


def kind_of(default) -> str:
    """How a refusal names the values a field takes, from the type of its default."""
    kinds = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return kinds.get(type(default), f"a {type(default).__name__}")


def fits(value, default) -> bool:
    """Whether `value` has the type of the field whose default is `default`, as
    `--config.<key>=<value>` is parsed (`fxformer.configfile`): a number field takes an integer
    too; a bool is no integer, and an integer no bool."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return default is None or isinstance(value, type(default))


def parse_value(key: str, raw: str, current: Any) -> Any:
    """A command-line value `raw` (`--config.<key>=<raw>`) parsed as the type of the field's current value."""
    kind = kind_of(current)
    try:
        if isinstance(current, bool):
            lowered = raw.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError
            return lowered in ("true", "1")
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            return float(raw)
        if isinstance(current, str):
            return raw
        value = ast.literal_eval(raw)
        if current is not None and not isinstance(value, type(current)):
            raise ValueError
        return value
    except (ValueError, SyntaxError):
        raise UserError(f"Config key '{key}' takes {kind}, and '{raw}' is not.") from None


def check_fields(config) -> None:
    """Refuse, in one sentence, a key fxformer/schema.py does not define (naming the closest one) or
    a value of another type than its field's: what a command-line override is refused for."""
    defaults = schema.defaults().to_dict()
    given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
    _check_fields(given, defaults, defaults, "")


def _shown(value) -> str:
    """A value as JSON writes it, cut to a few words."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_fields(given: dict, defaults: dict, root: dict, prefix: str) -> None:
    for name, value in given.items():
        key = prefix + name
        if "." in name:
            raise UserError(f"Config key '{key}' is written with dots; nest it in its sections as the other keys are.")
        if key in RENAMED:  # older code's name for a field, moved by `upgrade`
            default = lookup(root, RENAMED[key])
        else:
            default = defaults[name] if name in defaults else lookup(root, key)  # unknown: the closest known key
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise UserError(f"Config key '{key}' is a section of fields, and {_shown(value)} is not.")
            _check_fields(value, default, root, key + ".")
        elif not fits(value, default):
            raise UserError(f"Config key '{key}' takes {kind_of(default)}, and {_shown(value)} is not.")


# ---------------------------------------------------------------------------------------------
# Checks: each refusal of a config in one sentence, all before anything is written


AT_LEAST = {
    "num_train_steps": 0, "log_every_steps": 1, "eval_every_steps": 1, "checkpoint_every_steps": 1,
    "keep_checkpoints": 0, "grad_accum_steps": 1, "warmup_steps": 1, "eval_batches": 0,
    "average_last": 1, "checkpoint_every_minutes": 0,
    "divergence_factor": 0, "train_minutes": 0, "early_stopping_patience": 0, "loss_chunk_tokens": 0,
    "early_stopping_min_delta": 0,
    "data.max_length": 2, "data.tokens_per_batch": 1, "data.eval_batch_size": 1, "data.num_shards": 0,
    "data.workers": 0, "data.device_prefetch": 0, "data.train_pairs": 0,
    "data.vocab_size": 8, "data.tokenizer_sentences": 1,
}  # fmt: skip
BEST_METRICS = ("", "dev_ppl", "dev_loss", "dev_nll", "dev_accuracy", "dev_bleu")
EMBEDDED_CORPORA = ("embedded", "embedded2")  # data.dataset of fxformer's own corpora (en -> de)


def validate(
    config: ml_collections.ConfigDict, backend: str | None = None, processes: int = 1, stored: bool = False
) -> None:
    """Refuse, in one sentence, a config that training cannot run with: every check of a config,
    run before anything is written. `backend` (jax.default_backend()) and `processes`
    (jax.process_count()) describe the machine, for the checks that depend on it (None: a GPU
    is not asked for). `stored`: a trained run's config read back (`load_workdir_config`), which
    older code may have written without today's two checks of what a command does with it:
    early stopping's metric (checked again where a run starts training: its command line's config)
    and room for the decode length (checked after the `--config.decode` overrides that can
    repair it, `configfile.apply_decode_overrides`)."""
    _check_training(config, stored)
    ema_decays(config)
    _check_data(config, processes)
    _check_model(config.model, backend)
    check_decode(config, room=not stored)


def ema_decays(config: ml_collections.ConfigDict) -> tuple[float, ...]:
    """The decays of the smoothed weights `ema_decay` asks for ("0": none), each in (0, 1), in the
    order given; refused in one sentence otherwise."""
    text = str(config.get("ema_decay", "0")).strip()
    try:
        decays = tuple(float(part) for part in text.split(","))
    except ValueError:
        decays = None
    if decays == (0.0,):
        return ()
    if not decays or not all(0.0 < d < 1.0 for d in decays) or len(set(decays)) < len(decays):
        raise UserError(
            f"ema_decay={text} is not a decay: give 0 (off), a number between 0 and 1 (0.9999), or several "
            "different ones separated by commas (0.9999,0.999)."
        )
    return decays


def check_decode(config: ml_collections.ConfigDict, room: bool = True) -> None:
    """The decode section's values, and (`room`) room in the model's positions for an input beside
    its output."""
    options = DecodeOptions.of(config.decode)
    if room and options.max_extra >= config.model.max_len:
        raise UserError(
            f"decode.max_extra ({options.max_extra}) must be below model.max_len ({config.model.max_len}): a "
            f"translation is at most input length + max_extra positions of the model's; e.g. "
            f"{min(50, max(1, config.model.max_len // 2))}."
        )


def _check_training(config: ml_collections.ConfigDict, stored: bool = False) -> None:
    """The loop's and the optimizer's numbers, and the metric the best checkpoint is chosen by
    (`stored`: not early stopping's need of it, see `validate`)."""
    for key, low in AT_LEAST.items():
        value = lookup(config, key)
        if value < low:
            raise UserError(f"{key} must be at least {low}, not {value}.")
    if not config.early_stopping_min_delta < 1:
        raise UserError(
            f"early_stopping_min_delta must be below 1 (a share: 0.01 is 1%), not {config.early_stopping_min_delta}."
        )
    if not 0 <= config.label_smoothing < 1:
        raise UserError(f"label_smoothing must be in [0, 1), not {config.label_smoothing}.")
    if not (math.isfinite(config.learning_rate_scale) and config.learning_rate_scale > 0):
        raise UserError(f"learning_rate_scale must be a positive number, not {config.learning_rate_scale}.")
    for key in ("adam_b1", "adam_b2"):
        if not 0 <= config[key] < 1:
            raise UserError(f"{key} must be in [0, 1), not {config[key]}.")
    if not config.adam_eps > 0:
        raise UserError(f"adam_eps must be positive, not {config.adam_eps}.")
    if config.best_metric not in BEST_METRICS:
        names = ", ".join(map(repr, BEST_METRICS))
        raise UserError(f"best_metric must be one of {names}, not {config.best_metric!r}.")
    if config.early_stopping_patience and not config.best_metric and not stored:
        raise UserError(
            "early_stopping_patience counts dev evaluations of best_metric: set best_metric (e.g. dev_ppl) "
            "or early_stopping_patience=0."
        )
    if config.dev_bleu_every_steps < 0 or config.dev_bleu_sentences < 0:
        raise UserError("dev_bleu_every_steps and dev_bleu_sentences must be 0 or more.")
    if config.best_metric == "dev_bleu" and not config.dev_bleu_every_steps:
        raise UserError("best_metric=dev_bleu needs dev BLEU during training: set dev_bleu_every_steps, e.g. 5000.")


def _check_data(config: ml_collections.ConfigDict, processes: int) -> None:
    """The data section: lengths, languages, the embedded corpus's splits, the shards."""
    data = config.data
    if data.overlong not in ("drop", "truncate"):
        raise UserError(f"data.overlong must be 'drop' or 'truncate', not {data.overlong!r}.")
    if config.model.max_len < data.max_length:
        raise UserError(f"model.max_len ({config.model.max_len}) must cover data.max_length ({data.max_length}).")
    if data.source_lang == data.target_lang:
        raise UserError(
            f"data.source_lang and data.target_lang are both {data.source_lang!r}; "
            "a translation needs two different languages."
        )
    if data.dataset in EMBEDDED_CORPORA:
        for split in ("train", "validation", "test"):
            if data[f"num_{split}"] < 1:
                raise UserError(
                    f"data.num_{split} must be at least 1 for the {data.dataset} corpus, not {data[f'num_{split}']}."
                )
        if (data.source_lang, data.target_lang) != ("en", "de"):
            raise UserError(
                f"The {data.dataset} corpus translates en -> de; set data.source_lang=en, data.target_lang=de."
            )
    if data.num_shards % processes:
        raise UserError(f"data.num_shards={data.num_shards} must be a multiple of the {processes} processes.")


ACTIVATIONS = ("relu", "swish", "gelu")  # model.activation: the feed-forward's nonlinearity


def _check_model(model: ml_collections.ConfigDict, backend: str | None) -> None:
    """The model section: what the Transformer can be built with (and run on `backend`)."""
    d_k, d_v = head_widths(model)
    sizes = {
        "num_layers": model.num_layers,
        "d_model": model.d_model,
        "d_ff": model.d_ff,
        "num_heads": model.num_heads,
        "d_k": d_k,
        "d_v": d_v,
        "max_len": model.max_len,
    }
    rates = ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate")
    problems = [f"model.{f} must be positive, not {v}" for f, v in sizes.items() if v <= 0]
    problems += [f"model.{f} must be in [0, 1), not {model[f]}" for f in rates if not 0 <= model[f] < 1]
    if model.positional not in ("sinusoidal", "learned"):
        problems.append(f"model.positional must be 'sinusoidal' or 'learned', not {model.positional!r}")
    if model.norm not in ("post", "pre"):
        problems.append(f"model.norm must be 'post' or 'pre', not {model.norm!r}")
    if model.attention_impl not in ("xla", "cudnn", "auto"):
        problems.append(f"model.attention_impl must be 'xla', 'cudnn' or 'auto', not {model.attention_impl!r}")
    if model.d_model % 2:
        problems.append(f"model.d_model must be even (sinusoids come in sin/cos pairs), not {model.d_model}")
    if model.activation not in ACTIVATIONS:
        problems.append(f"model.activation must be one of {', '.join(ACTIVATIONS)}, not {model.activation!r}")
    if model.sinusoid_layout not in ("interleaved", "halves"):
        problems.append(f"model.sinusoid_layout must be 'interleaved' or 'halves', not {model.sinusoid_layout!r}")
    if not 0 < model.layer_norm_epsilon < 1:
        problems.append(f"model.layer_norm_epsilon must be in (0, 1), not {model.layer_norm_epsilon}")
    if model.dtype not in ("float32", "bfloat16"):
        problems.append(f"model.dtype must be 'float32' or 'bfloat16', not {model.dtype!r}")
    if problems:
        raise UserError(problems[0] + ".")
    attention_impl(model, backend)


def attention_impl(model: ml_collections.ConfigDict, backend: str | None) -> str:
    """`model.attention_impl` resolved for `backend` (jax.default_backend()): "xla", the reference,
    or "cudnn", the fused kernel (`fxformer.model.TransformerConfig`). "auto" takes cudnn where it
    serves and xla elsewhere; "cudnn" where it cannot serve is refused in one sentence, never
    silently changed. Decoding keeps xla whatever this says."""
    wanted = model.attention_impl
    if wanted == "xla":
        return "xla"
    d_k, d_v = head_widths(model)
    reasons = [
        (backend not in (None, "gpu"), f"a GPU (this is {backend})"),
        (d_k != d_v, f"d_k == d_v (here {d_k} vs {d_v})"),
        (d_k % 8 or d_k > 256, f"a head width d_k that is a multiple of 8, at most 256 (here {d_k})"),
        (model.attention_dropout_rate > 0, "attention_dropout_rate 0"),
        (model.dtype != "bfloat16", "dtype bfloat16"),
    ]
    missing = [what for failed, what in reasons if failed]
    if wanted == "auto":
        return "xla" if missing else "cudnn"
    if missing:
        raise UserError(
            f"model.attention_impl=cudnn needs {missing[0]}; use model.attention_impl=auto (cudnn where it "
            "serves) or xla."
        )
    return wanted


# ---------------------------------------------------------------------------------------------
# The decode section, as the searches take it


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """The `decode` section (fxformer/schema.py says what each field means) as the searches
    (`fxformer.inference.search`) take it: frozen and hashable, so static under jit. One the
    searches cannot run is refused in one sentence when it is made (`of` a section)."""

    STRATEGIES: ClassVar[tuple[str, ...]] = ("beam", "greedy", "sample")
    BEAM_VARIANTS: ClassVar[tuple[str, ...]] = ("live", "t2t")  # fxformer's; tensor2tensor's (the paper's code)

    strategy: str
    beam_size: int
    alpha: float
    beam_variant: str
    max_extra: int
    nbest: int
    temperature: float
    top_k: int
    seed: int

    @classmethod
    def of(cls, section: ml_collections.ConfigDict) -> DecodeOptions:
        """The options a config's `decode` section gives."""
        return cls(**{field.name: section[field.name] for field in dataclasses.fields(cls)})

    def to_dict(self) -> dict:
        """The options as the `decode` section's fields."""
        return dataclasses.asdict(self)

    def __post_init__(self):
        """Refuse, in one sentence, options the searches cannot run."""
        if self.strategy not in self.STRATEGIES:
            raise UserError(f"decode.strategy must be one of {', '.join(self.STRATEGIES)}, not {self.strategy!r}.")
        if self.beam_variant not in self.BEAM_VARIANTS:
            variants = " or ".join(self.BEAM_VARIANTS)
            raise UserError(f"decode.beam_variant must be {variants}, not {self.beam_variant!r}.")
        for key, low in (("beam_size", 1), ("nbest", 1), ("max_extra", 0), ("top_k", 0), ("alpha", 0)):
            if getattr(self, key) < low:
                raise UserError(f"decode.{key} must be at least {low}, not {getattr(self, key)}.")
        if not self.temperature >= 0:
            raise UserError(f"decode.temperature must be 0 or more, not {self.temperature}.")
        if self.strategy == "beam" and self.nbest > self.beam_size:
            raise UserError(f"decode.nbest ({self.nbest}) cannot exceed decode.beam_size ({self.beam_size}).")
        if self.strategy == "greedy" and self.nbest > 1:
            raise UserError("decode.nbest > 1 needs decode.strategy=beam or sample; greedy search finds one.")


# ---------------------------------------------------------------------------------------------
# W/config.json: the resolved config a run trains with


# How the model is computed, not what it is (the same parameters, the same function): may change
# on resume. dropout_bits draws other dropout masks, as a resume on other devices may.
RUNTIME_FIELDS = {
    "attention_impl",
    "segment_attention",
    "segment_block_k",
    "dropout_bits",
    "residual_norm",
    "loss_impl",
}


def load_workdir_config(workdir: paths.Workdir) -> ml_collections.ConfigDict:
    """The resolved config a run wrote into its workdir, as today's code reads it: one written by
    older code gets the fields added since (`upgrade`), after the same checks as a config from
    the command line: every key known and every value of its field's type (`check_fields`),
    then `validate`. Every command that reads a workdir's config reads it here, so a hand-edited
    config.json is refused in one sentence naming the file and the key, before anything runs."""
    path = workdir.config
    if not path.exists():
        raise UserError(f"{workdir} has no config.json; is it a training workdir?")
    try:
        loaded = json.loads(path.read_text())
        if not isinstance(loaded, dict) or "model" not in loaded:
            raise ValueError("not a config")
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(
            f"{path} is damaged ({type(e).__name__}); write it again by training with the run's --config."
        ) from None
    try:
        check_fields(loaded)
        config = upgrade(ml_collections.ConfigDict(loaded))
        validate(config, stored=True)
    except UserError as e:
        reason = str(e).rstrip(".")
        raise UserError(
            f"In {path}, {reason[:1].lower()}{reason[1:]}; correct that file, which records the run's config."
        ) from None
    return config


def check_workdir_config(config: ml_collections.ConfigDict, workdir: paths.Workdir) -> None:
    """Refuse a workdir whose recorded model differs from the config's (nothing is written)."""
    if not workdir.config.exists():
        return
    old = load_workdir_config(workdir).to_dict()
    new = json.loads(config.to_json())
    keys = (set(old["model"]) | set(new["model"])) - RUNTIME_FIELDS
    changed = [k for k in keys if old["model"].get(k) != new["model"].get(k)]
    if changed:
        raise UserError(
            f"{workdir} holds a model with a different model.{changed[0]} "
            f"({old['model'].get(changed[0])} vs {new['model'].get(changed[0])}); use a new --workdir."
        )


def config_changes(old: dict, new: dict, shared_only: bool = False, prefix: str = "") -> dict[str, list]:
    """{dotted key: [old, new]} for every field whose value differs between two configs, in key
    order; a field only one side has counts as None on the other, or with `shared_only` is
    skipped (a field the code added or removed, not a change of the config)."""
    out = {}
    keys = set(old) & set(new) if shared_only else set(old) | set(new)
    for key in sorted(keys):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(config_changes(a, b, shared_only, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = [a, b]
    return out


def write_workdir_config(config: ml_collections.ConfigDict, workdir: paths.Workdir, step: int = 0) -> None:
    """Record the resolved config the run trains with, once training really goes on from `step`
    (train's process 0 calls it when a new run starts, and for a resume at its first save).
    Fields a resume changed (`num_train_steps`, the schedule, intervals, ...) are appended to
    `W/config-history.jsonl` with the step from which they hold, so no value is overwritten
    silently."""
    new = json.loads(config.to_json())
    if workdir.config.exists():
        changed = config_changes(load_workdir_config(workdir).to_dict(), new)
        if not changed:
            return
        history = workdir.config_history.read_text() if workdir.config_history.exists() else ""
        line = json.dumps({"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "changed": changed})
        paths.write_atomic(workdir.config_history, history + line + "\n")
    workdir.config.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(workdir.config, config.to_json(indent=2))  # other processes read the old file or the new one
