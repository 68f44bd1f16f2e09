"""Workdir configs written by older code still train, evaluate and translate.

tests/fixtures/config-with-decode.json is the config.json a tiny run wrote before the config had one
home; config-early.json is the same run as written before the `decode` section and
the fields added since (beam_size, alpha and max_decode_extra at top level; no
divergence_factor, train_minutes, best_metric, early_stopping_patience, dev BLEU, the text
dataset's separate files, model.attention_impl). Their `data.tfds_data_dir` is set to the
session's corpus by the test.
"""

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import jax
import ml_collections
import pytest
from conftest import env_with_devices

from configs import base
from experiments.analysis import records
from fxformer import config, configfile, paths
from fxformer.errors import UserError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LINES = "The dog sees the man.\nToday the woman buys a book.\n"


def run(module, *args, stdin=None):
    result = subprocess.run(
        [sys.executable, "-m", module, *args], env=env_with_devices(1), capture_output=True, text=True, input=stdin
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def workdir_from(fixture: str, tmp_path, data_dir) -> Path:
    """A workdir holding only the fixture's config.json, reading the session's corpus."""
    config = json.loads((FIXTURES / fixture).read_text())
    config["data"]["tfds_data_dir"] = str(data_dir)
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(config, indent=2))
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("fixture, beam_size", [("config-with-decode.json", 4), ("config-early.json", 2)])
def test_a_config_written_by_older_code_trains_evaluates_and_translates(fixture, beam_size, tmp_path, data_dir, corpus):
    workdir = workdir_from(fixture, tmp_path, data_dir)
    trained = run("fxformer.train", f"--workdir={workdir}")  # the workdir's own config
    assert "step 4/4" in trained
    run("fxformer.evaluate", f"--workdir={workdir}", "--limit=8")
    written = json.loads((workdir / "eval" / "test-4-first8.json").read_text())
    assert written["decode"]["beam_size"] == beam_size
    out = run("fxformer.translate", f"--workdir={workdir}", "--config.decode.nbest=2", stdin=LINES)
    assert len(out.splitlines()) == 2 * 2


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_upgrade_fills_exactly_the_missing_fields_from_the_defaults_and_keeps_the_rest():
    early, defaults = fixture("config-early.json"), base.get_config().to_dict()
    upgraded = config.upgrade(ml_collections.ConfigDict(early)).to_dict()
    assert upgraded["decode"] == {**defaults["decode"], "beam_size": 2, "alpha": 0.6, "max_extra": 50}
    changes = config.config_changes(early, upgraded)
    added = {key: new for key, (old, new) in changes.items() if old is None}
    assert set(added) == {
        "decode",
        "dev_bleu_every_steps",
        "dev_bleu_sentences",
        "best_metric",
        "early_stopping_patience",
        "train_minutes",
        "divergence_factor",
        "model.attention_impl",
        "data.validation_source_file",
        "data.validation_target_file",
        "data.test_source_file",
        "data.test_target_file",
        "data.workers",
        "data.device_prefetch",
        "data.train_pairs",
        "loss_chunk_tokens",
        "early_stopping_min_delta",
        "model.segment_attention",
        "model.dropout_bits",
        "model.residual_norm",
        "model.loss_impl",
        "model.segment_block_k",
        "model.qkv_projection",
        "flat_update",
        *("model.activation", "model.sinusoid_layout", "model.layer_norm_epsilon", "model.output_bias"),
        "model.scale_embedding",
        "ema_decay",
    }
    for key in set(added) - {"decode"}:  # the decode section: checked above
        section, _, leaf = key.rpartition(".")
        assert added[key] == (defaults[section] if section else defaults)[leaf], key
    moved = {key: old for key, (old, new) in changes.items() if new is None}
    assert moved == {"beam_size": 2, "alpha": 0.6, "max_decode_extra": 50}  # into the decode section
    assert set(changes) == set(added) | set(moved)  # every field it had keeps its value


MARIAN_FIELDS = {  # the model options a Marian model needs, each at the paper's value
    "activation": "relu",
    "sinusoid_layout": "interleaved",
    "layer_norm_epsilon": 1e-6,
    "output_bias": False,
    "scale_embedding": True,
}


def test_a_config_written_with_the_decode_section_upgrades_to_itself_and_the_fields_added_since():
    written = fixture("config-with-decode.json")
    since = {"workers": 0, "device_prefetch": 0, "train_pairs": 0}  # the stored-ids input pipeline; a text subset
    assert config.upgrade(ml_collections.ConfigDict(written)).to_dict() == {
        **written,
        "data": {**written["data"], **since},
        "loss_chunk_tokens": 0,  # the chunked loss
        "flat_update": False,  # Adam over one flat vector
        "ema_decay": "0",  # no smoothed weights
        "early_stopping_min_delta": 0.0,  # the plateau with a smallest improvement
        "model": {  # the kernel options, each at the value that keeps the step as it was
            **written["model"],
            "segment_attention": "mask",
            "segment_block_k": 64,
            "qkv_projection": "separate",
            "dropout_bits": 32,
            "residual_norm": "flax",
            "loss_impl": "reductions",
            **MARIAN_FIELDS,
        },
    }


@pytest.mark.parametrize("name", ["config-early.json", "config-with-decode.json"])
def test_downgrade_gives_back_what_older_code_wrote_from_its_upgrade(name):
    written = fixture(name)  # older code writes every field it knows: its keys are its defaults' keys
    assert config.downgrade(config.upgrade(ml_collections.ConfigDict(written)).to_dict(), written) == written


def test_downgrade_refuses_a_field_older_code_lacks_at_another_value_than_the_default():
    written = fixture("config-with-decode.json")
    today = config.upgrade(ml_collections.ConfigDict(written)).to_dict()
    for key, value in {"flat_update": True, "model.loss_impl": "fused"}.items():
        changed = json.loads(json.dumps(today))
        node, leaf = config.walk(changed, key)
        node[leaf] = value
        with pytest.raises(UserError, match=rf"{re.escape(key)}={value!r} is not today's default"):
            config.downgrade(changed, written)


def test_the_regime_records_downgrade_to_older_code_and_upgrade_back_unchanged():
    """The records collected by today's code, restored by older code (experiments/scripts/regime-runs.sh):
    every finished run's config, downgraded to the fields of a config written before the kernel
    options, upgrades back to the record."""
    doc = records.read(FIXTURES.parent.parent / "experiments" / "results" / "table3-regime" / "records.jsonl.gz")
    older = records.downgraded(doc, fixture("config-with-decode.json"))
    pairs = zip(doc["replicates"], older["replicates"], strict=True)
    configs = [(rep["config"], old["config"]) for rep, old in pairs if rep.get("config")]
    assert len(configs) >= 44
    for now, old in configs:
        assert "flat_update" not in old and "loss_impl" not in old["model"]
        upgraded = config.upgrade(ml_collections.ConfigDict(old)).to_dict()
        assert upgraded == {**now, "model": {**now["model"], **MARIAN_FIELDS}, "ema_decay": "0"}  # they predate those


REFUSALS = [  # (overrides of configs/default.py, the machine, the refusal's words): one per check
    *(({key: low - 1}, {}, f"{key} must be at least {low}, not {low - 1}") for key, low in config.AT_LEAST.items()),
    ({"label_smoothing": 1.0}, {}, "label_smoothing must be in [0, 1), not 1.0"),
    ({"early_stopping_min_delta": 1.0}, {}, "early_stopping_min_delta must be below 1 (a share: 0.01 is 1%)"),
    ({"learning_rate_scale": -1.0}, {}, "learning_rate_scale must be a positive number"),
    ({"learning_rate_scale": math.nan}, {}, "learning_rate_scale must be a positive number"),
    ({"learning_rate_scale": math.inf}, {}, "learning_rate_scale must be a positive number"),
    ({"adam_b1": -0.1}, {}, "adam_b1 must be in [0, 1)"),
    ({"adam_b2": 1.0}, {}, "adam_b2 must be in [0, 1)"),
    ({"adam_eps": 0.0}, {}, "adam_eps must be positive"),
    ({"ema_decay": "0.9,1"}, {}, "ema_decay=0.9,1 is not a decay: give 0 (off), a number between 0 and 1"),
    ({"best_metric": "bleu"}, {}, "best_metric must be one of '', 'dev_ppl'"),
    ({"dev_bleu_sentences": -1}, {}, "dev_bleu_every_steps and dev_bleu_sentences must be 0 or more."),
    ({"best_metric": "dev_bleu"}, {}, "best_metric=dev_bleu needs dev BLEU during training"),
    ({"best_metric": "", "early_stopping_patience": 3}, {}, "early_stopping_patience counts dev evaluations of"),
    ({"data.overlong": "cut"}, {}, "data.overlong must be 'drop' or 'truncate', not 'cut'"),
    ({"model.max_len": 32}, {}, "model.max_len (32) must cover data.max_length (64)"),
    ({"data.source_lang": "de"}, {}, "two different languages"),
    ({"data.num_train": 0}, {}, "data.num_train must be at least 1 for the embedded corpus, not 0"),
    ({"data.num_test": 0}, {}, "data.num_test must be at least 1 for the embedded corpus, not 0"),
    ({"data.source_lang": "fr"}, {}, "The embedded corpus translates en -> de"),
    ({"data.num_shards": 3}, {"processes": 2}, "data.num_shards=3 must be a multiple of the 2 processes"),
    ({"model.d_model": 33, "model.d_k": 8, "model.d_v": 8}, {}, "model.d_model must be even"),
    ({"model.d_model": 33}, {}, "model.d_model (33) is not divisible by model.num_heads (4)"),
    ({"model.num_layers": 0}, {}, "model.num_layers must be positive, not 0"),
    ({"model.d_v": -8}, {}, "model.d_v must be positive, not -8"),
    ({"model.dropout_rate": 1.0}, {}, "model.dropout_rate must be in [0, 1), not 1.0"),
    ({"model.positional": "rotary"}, {}, "model.positional must be 'sinusoidal' or 'learned'"),
    ({"model.norm": "mid"}, {}, "model.norm must be 'post' or 'pre'"),
    ({"model.attention_impl": "flash"}, {}, "model.attention_impl must be 'xla', 'cudnn' or 'auto'"),
    ({"model.dtype": "float16"}, {}, "model.dtype must be 'float32' or 'bfloat16', not 'float16'"),
    ({"model.attention_impl": "cudnn"}, {"backend": "cpu"}, "model.attention_impl=cudnn needs a GPU (this is cpu)"),
    ({"model.attention_impl": "cudnn", "model.dtype": "bfloat16", "model.d_k": 16, "model.d_v": 32},
     {"backend": "gpu"}, "model.attention_impl=cudnn needs d_k == d_v (here 16 vs 32)"),
    ({"model.attention_impl": "cudnn", "model.dtype": "bfloat16", "model.attention_dropout_rate": 0.1},
     {"backend": "gpu"}, "needs attention_dropout_rate 0"),
    ({"model.attention_impl": "cudnn"}, {"backend": "gpu"}, "model.attention_impl=cudnn needs dtype bfloat16"),
    ({"decode.strategy": "nucleus"}, {}, "decode.strategy must be one of beam, greedy, sample, not 'nucleus'"),
    ({"decode.max_extra": 4096}, {}, "decode.max_extra (4096) must be below model.max_len"),
    ({"decode.beam_variant": "wide"}, {}, "decode.beam_variant must be live or t2t, not 'wide'"),
    *(({f"decode.{key}": low - 1}, {}, f"decode.{key} must be at least {low}")
      for key, low in (("beam_size", 1), ("nbest", 1), ("max_extra", 0), ("top_k", 0), ("alpha", 0))),
    ({"decode.temperature": -1.0}, {}, "decode.temperature must be 0 or more, not -1.0"),
    ({"decode.nbest": 5}, {}, "decode.nbest (5) cannot exceed decode.beam_size (4)"),
    ({"decode.strategy": "greedy", "decode.nbest": 2}, {}, "decode.nbest > 1 needs decode.strategy=beam or sample"),
]  # fmt: skip


@pytest.mark.parametrize("overrides, machine, message", REFUSALS)
def test_validate_refuses_each_mistake_in_one_sentence(overrides, machine, message):
    wrong = config.with_overrides(configfile.load_config("configs/default.py"), overrides)
    with pytest.raises(UserError, match=re.escape(message)):
        config.validate(wrong, **machine)


def test_validate_accepts_every_shipped_config():
    for spec in ("configs/default.py", "configs/base.py", "configs/big.py", "configs/table3.py:C4,mini"):
        config.validate(configfile.resolve(spec), backend="cpu")
    config.validate(configfile.resolve("configs/base.py", [("data.num_shards", "4")]), processes=2)


def test_attention_impl_auto_takes_cudnn_only_where_it_serves():
    fused = config.with_overrides(base.get_config(), {"model.attention_impl": "auto", "model.dtype": "bfloat16"}).model
    assert config.attention_impl(fused, "gpu") == "cudnn"
    assert config.attention_impl(fused, "cpu") == "xla"  # no GPU: the reference path, identical results
    assert config.attention_impl(config.with_overrides(fused, {"dtype": "float32"}), "gpu") == "xla"
    one_head = config.with_overrides(fused, {"num_heads": 1})  # Table 3's A1: a head 512 wide, beyond cuDNN's 256
    assert config.attention_impl(one_head, "gpu") == "xla"
    with pytest.raises(UserError, match=r"needs a head width d_k that is a multiple of 8, at most 256 \(here 512\)"):
        config.attention_impl(config.with_overrides(one_head, {"attention_impl": "cudnn"}), "gpu")


def test_one_walker_reads_and_sets_nested_keys_of_configs_and_their_dicts():
    cfg = base.get_config()
    assert config.lookup(cfg, "model.d_model") == config.lookup(cfg.to_dict(), "model.d_model") == 512
    assert config.lookup(cfg, "seed") == 0 and config.lookup(cfg, "decode").beam_size == 4
    node, leaf = config.walk(cfg, "decode.beam_size")
    assert node is cfg.decode and leaf == "beam_size"
    config.with_overrides(cfg, {"model.d_model": 1024, "decode.alpha": 1.0, "seed": 3})
    assert (cfg.model.d_model, cfg.decode.alpha, cfg.seed) == (1024, 1.0, 3)
    configfile.apply_override(cfg, "data.max_length", "128")
    assert cfg.data.max_length == 128
    keys = config.dotted_keys(cfg)
    assert "model.num_layers" in keys and "decode.seed" in keys and "model" not in keys
    assert "model" in config.dotted_keys(cfg, sections=True)


@pytest.mark.parametrize(
    "key, words",
    [
        ("model.num_head", "Unknown config key 'model.num_head' (did you mean 'model.num_heads'?)."),
        ("modle.d_model", "Unknown config key 'modle.d_model' (did you mean 'model.d_model'?)."),
        ("model.d_model.x", "Unknown config key 'model.d_model.x'"),  # through a field
        ("nothing_like_it", "Unknown config key 'nothing_like_it'."),
    ],
)
def test_the_walker_refuses_an_unknown_key_naming_the_closest(key, words):
    for cfg in (base.get_config(), base.get_config().to_dict()):
        with pytest.raises(UserError, match=re.escape(words)):
            config.lookup(cfg, key)
    with pytest.raises(UserError, match=re.escape(words)):
        config.with_overrides(base.get_config(), {key: 1})
    with pytest.raises(UserError, match=re.escape(words)):
        configfile.apply_override(base.get_config(), key, "1")


def test_decode_options_are_frozen_hashable_and_round_trip_the_section():
    section = base.get_config().decode
    options = config.DecodeOptions.of(section)
    assert options.to_dict() == section.to_dict()
    assert config.DecodeOptions.of(ml_collections.ConfigDict(options.to_dict())) == options
    assert hash(options) == hash(config.DecodeOptions.of(section)) and len({options, dataclasses.replace(options)}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam_size = 8
    assert dataclasses.replace(options, nbest=1) != dataclasses.replace(options, nbest=2)
    with pytest.raises(UserError, match="decode.nbest \\(5\\) cannot exceed decode.beam_size \\(4\\)"):
        dataclasses.replace(options, nbest=5)
    jitted = jax.jit(lambda x, o: x * o.beam_size, static_argnums=1)  # static under jit
    assert int(jitted(2, options)) == 8


# ---------------------------------------------------------------------------------------------
# A workdir's config.json, edited by hand: the checks of a config from the command line


def written_workdir(tmp_path, edit, resolved=True) -> Path:
    """A workdir whose config.json is configs/default.py's config (resolved, as train writes it:
    d_k and d_v set), changed by `edit`."""
    loaded = configfile.resolve("configs/default.py") if resolved else configfile.load_config("configs/default.py")
    written = json.loads(loaded.to_json())
    edit(written)
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(written, indent=2))
    return workdir


def set_field(key, value):
    """An edit of config.json that sets `key`: a top-level key, or a section's name, a dot and one
    JSON key of that section."""

    def edit(written):
        section, dot, leaf = key.partition(".")
        (written[section] if dot else written)[leaf if dot else key] = value

    return edit


EDITS = [  # (an edit of config.json, the words of its refusal)
    (set_field("model.num_heads", 0), "model.num_heads must be positive, not 0"),
    (set_field("model.d_model", "sixty-four"), 'config key \'model.d_model\' takes an integer, and "sixty-four"'),
    (set_field("dropout_rat", 0.3), "unknown config key 'dropout_rat' (did you mean 'model.dropout_rate'?)"),
    (set_field("model.num_head", 4), "unknown config key 'model.num_head' (did you mean 'model.num_heads'?)"),
    (set_field("model.d_model", 64.0), "config key 'model.d_model' takes an integer, and 64.0 is not"),
    (set_field("model.attention_bias", 0), "config key 'model.attention_bias' takes true or false, and 0 is not"),
    (set_field("model.num_heads", True), "config key 'model.num_heads' takes an integer, and true is not"),
    (set_field("data.dataset", 7), "config key 'data.dataset' takes a string, and 7 is not"),
    (set_field("decode", 4), "config key 'decode' is a section of fields, and 4 is not"),
    (set_field("model.d_ff", {"x": 1}), "config key 'model.d_ff' takes an integer, and {\"x\": 1} is not"),
    (set_field("beam_size", "four"), "config key 'beam_size' takes an integer, and \"four\" is not"),  # older name
    (set_field("model.d_model.x", 1), "config key 'model.d_model.x' is written with dots"),  # a key "d_model.x"
]  # fmt: skip


@pytest.mark.parametrize("edit, words", EDITS)
def test_a_hand_edited_workdir_config_is_refused_naming_the_file_and_the_key(edit, words, tmp_path):
    workdir = written_workdir(tmp_path, edit)
    with pytest.raises(UserError) as refused:
        config.load_workdir_config(paths.Workdir(workdir))
    message = str(refused.value)
    assert message.startswith(f"In {workdir / 'config.json'}, {words}"), message
    assert message.endswith("; correct that file, which records the run's config.") and "\n" not in message


def test_a_resume_may_change_how_the_model_is_computed_but_not_what_it_is(tmp_path):
    """The kernel options and attention_impl are computation (the same parameters and function);
    every other model field is the model: a workdir holding another one is refused."""
    workdir = paths.Workdir(written_workdir(tmp_path, lambda written: None))
    same = configfile.resolve("configs/default.py")
    computed = {"attention_impl": "auto", "segment_attention": "pallas", "dropout_bits": 8}
    computed |= {"residual_norm": "fused", "loss_impl": "one_pass"}
    for key, value in computed.items():
        changed = ml_collections.ConfigDict(same.to_dict())
        changed.model[key] = value
        config.check_workdir_config(changed, workdir)  # accepted
    changed = ml_collections.ConfigDict(same.to_dict())
    changed.model.num_heads = 2 * same.model.num_heads
    with pytest.raises(UserError, match=f"holds a model with a different model.num_heads \\({same.model.num_heads} vs"):
        config.check_workdir_config(changed, workdir)


# what a command does with a run's config, not the run itself: checked where it starts training or searching
WHEN_USED = ("early_stopping_patience counts dev evaluations of", "decode.max_extra (4096) must be below")
WORKDIR_REFUSALS = [
    (overrides, message)
    for overrides, machine, message in REFUSALS
    if not machine and not message.startswith(WHEN_USED)
]


def test_a_run_trained_before_two_checks_still_loads_and_a_decode_override_repairs_it(tmp_path):
    """Older code wrote patience without best_metric (it never stopped early) and max_extra 50 beside
    a 48-position model: the run's config reads; a search with it is refused until --config.decode
    gives room, and training with that combination from the command line is refused."""
    edits = {"best_metric": "", "early_stopping_patience": 3, "model.max_len": 48, "data.max_length": 32}
    workdir = written_workdir(tmp_path, lambda written: [set_field(k, v)(written) for k, v in edits.items()])
    stored = config.load_workdir_config(paths.Workdir(workdir))
    assert stored.early_stopping_patience == 3 and stored.decode.max_extra == 50 and stored.model.max_len == 48
    with pytest.raises(UserError, match=re.escape("decode.max_extra (50) must be below model.max_len (48)")) as e:
        configfile.apply_decode_overrides(stored.copy_and_resolve_references(), [], workdir)
    assert str(e.value).endswith("e.g. 24.")  # a value that fits, not the default that does not
    searched = configfile.apply_decode_overrides(
        stored.copy_and_resolve_references(), [("decode.max_extra", "8")], workdir
    )
    assert searched.decode.max_extra == 8
    for key in ("early_stopping_patience", "decode.max_extra"):
        with pytest.raises(UserError, match=re.escape(key)):
            config.validate(stored)  # the same config on a training command line
        stored = config.with_overrides(stored, {"early_stopping_patience": 0})


@pytest.mark.parametrize("overrides, message", WORKDIR_REFUSALS)
def test_every_check_of_validate_holds_for_a_workdirs_config(overrides, message, tmp_path):
    edit = lambda written: [set_field(key, value)(written) for key, value in overrides.items()]  # noqa: E731
    workdir = written_workdir(tmp_path, edit, resolved=False)  # d_k, d_v 0: d_model / h, checked as such
    with pytest.raises(UserError, match=re.escape(f"In {workdir / 'config.json'}, ")) as refused:
        config.load_workdir_config(paths.Workdir(workdir))
    assert message[:1].lower() + message[1:].rstrip(".") in str(refused.value)


def test_a_wrong_type_reads_as_on_the_command_line():
    with pytest.raises(UserError, match=re.escape("Config key 'model.d_model' takes an integer, and 'sixty-four'")):
        configfile.apply_override(base.get_config(), "model.d_model", "sixty-four")
    with pytest.raises(UserError, match=re.escape("Config key 'model.d_model' takes an integer, and \"sixty-four\"")):
        config.check_fields({"model": {"d_model": "sixty-four"}})
    config.check_fields({"train_minutes": 5, "model": {"dropout_rate": 0}})  # a number field takes an integer
    config.check_fields(base.get_config())


@pytest.mark.parametrize("name", ["config-with-decode.json", "config-early.json"])
def test_configs_written_by_older_code_pass_the_checks(name, tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "config.json").write_text((FIXTURES / name).read_text())
    assert (
        config.load_workdir_config(paths.Workdir(workdir)).to_dict()
        == config.upgrade(ml_collections.ConfigDict(fixture(name))).to_dict()
    )


def test_every_config_resolves_to_the_values_it_had_before_the_schema_moved_into_the_library():
    """tests/fixtures/configs-resolved.json: every config (default, base, big, multi30k, each Table 3
    row in each profile) as it resolved while the defaults lived in configs/base.py;
    multi30k's entry since as its recipe was frozen after pilot P3, with the length
    penalty P5 re-chose on val (alpha 1.5). Fields added since
    (`loss_chunk_tokens`) are compared at their defaults, as `config.upgrade` gives them to an old run."""
    before = json.loads((Path(__file__).parent / "fixtures" / "configs-resolved.json").read_text())
    from configs import table3

    specs = ["configs/default.py", "configs/base.py", "configs/big.py", "configs/multi30k.py"]
    later = ("multi30k", "multi30k-full", "multi30k-full-lr2")  # these came after the move
    earlier = [p for p in table3.PROFILES if p not in later]
    specs += [f"configs/table3.py:{row},{profile}" for profile in earlier for row in table3.ROWS]
    assert sorted(specs) == sorted(before)
    for spec in specs:
        then = config.upgrade(ml_collections.ConfigDict(before[spec]))
        assert json.loads(configfile.resolve(spec).to_json()) == json.loads(then.to_json()), spec
