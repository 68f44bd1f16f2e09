"""fxformer.attention_maps against independent computations: the weights by hand from the parameters,
masks, batch invariance, tokens and limits, the summary, and the command on a trained run."""

import dataclasses
import functools
import json
import math
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FakeBucket, env_with_devices, left_as_is, refused_in_process, small_config
from etils import epath
from test_paths import fake_gcs  # noqa: F401  (a fixture)

from configs import table3
from fxformer import attention_maps, attention_weights, exitcodes, inference, parallel
from fxformer.errors import UserError
from fxformer.model import Transformer, TransformerConfig
from fxformer.tokens import BOS_ID, EOS_ID, PAD_ID

CONFIGS = {  # post-norm with d_k != d_v; pre-norm, learned positions, one head, biases; 32 heads
    "post": TransformerConfig(vocab_size=23, num_layers=2, d_model=16, d_ff=32, num_heads=2, d_k=6, d_v=10, max_len=32),
    "pre": TransformerConfig(vocab_size=23, num_layers=2, d_model=16, d_ff=32, num_heads=1, d_k=16, d_v=8, max_len=32,
                             norm="pre", positional="learned", attention_bias=True),
    "h32": TransformerConfig(vocab_size=23, num_layers=1, d_model=64, d_ff=32, num_heads=32, d_k=2, d_v=3, max_len=32),
}  # fmt: skip
INPUTS = np.array([[5, 6, 7, 8, 9, 3], [10, 11, 3, 0, 0, 0]])  # the second row is padded
TARGETS = np.array([[12, 13, 14, 3, 0], [15, 16, 17, 18, 3]])


@functools.cache
def init(config, seed=0):
    return jax.jit(Transformer(config).init)(jax.random.key(seed), jnp.asarray(INPUTS), jnp.asarray(TARGETS))["params"]


def by_hand(config, params, inputs, targets):
    """kind -> [b, N, h, q, k]: softmax(x_q W^Q (x_k W^K)^T / sqrt(d_k)) in float64 NumPy, masked keys 0."""
    capture = lambda module, method: isinstance(module, nn.LayerNorm)  # noqa: E731
    apply = functools.partial(Transformer(config).apply, capture_intermediates=capture, mutable=["intermediates"])
    _, state = jax.jit(apply)({"params": params}, jnp.asarray(inputs), jnp.asarray(targets))

    def layer_norm(path):  # a LayerNorm's output, as the model computed it
        tree = state["intermediates"]
        for key in path:
            tree = tree[key]
        return np.asarray(tree["__call__"][0], np.float64)

    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    decoder_inputs = np.concatenate([np.full((len(targets), 1), BOS_ID), targets[:, :-1]], axis=1)
    source = embedded(config, p, "encoder", inputs)
    target = embedded(config, p, "decoder", decoder_inputs)
    last = config.num_layers - 1
    encoded = layer_norm(
        ("encoder", "final_norm") if config.norm == "pre" else ("encoder", f"layer_{last}", "feed_forward_norm")
    )
    source_keys = inputs != PAD_ID  # [b, k]
    causal = np.tril(np.ones((targets.shape[1],) * 2, bool))
    masks = {
        "encoder": source_keys[:, None, :],
        "decoder": (targets != PAD_ID)[:, None, :] & causal,
        "cross": source_keys[:, None, :],
    }
    out = {kind: [] for kind in masks}
    for i in range(config.num_layers):
        layer = lambda side, name, i=i: layer_norm((side, f"layer_{i}", name))  # noqa: E731
        if config.norm == "pre":  # each sub-layer reads its own LayerNorm of the stream
            encoder_in, decoder_in = layer("encoder", "self_attention_norm"), layer("decoder", "self_attention_norm")
            cross_in = layer("decoder", "cross_attention_norm")
        else:  # each reads the stream: the embeddings, then the LayerNorm before it
            encoder_in, decoder_in, cross_in = source, target, layer("decoder", "self_attention_norm")
        for kind, side, sublayer, xq, xk in (
            ("encoder", "encoder", "self_attention", encoder_in, encoder_in),
            ("decoder", "decoder", "self_attention", decoder_in, decoder_in),
            ("cross", "decoder", "cross_attention", cross_in, encoded),
        ):
            out[kind].append(softmax_by_hand(config, p[side][f"layer_{i}"][sublayer], xq, xk, masks[kind]))
        if config.norm == "post":
            source, target = layer("encoder", "feed_forward_norm"), layer("decoder", "feed_forward_norm")
    return {kind: np.stack(layers, axis=1) for kind, layers in out.items()}


def embedded(config, p, side, tokens):
    """E[tokens] sqrt(d_model) + PE, the sinusoids written out here (or the learned table)."""
    length = tokens.shape[1]
    if config.positional == "learned":
        table = p[side]["positional"]["embedding"][:length]
    else:
        pos, i = np.arange(length)[:, None], np.arange(config.d_model)[None, :]
        angle = pos / 10000 ** ((i - i % 2) / config.d_model)
        table = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    return p["embed"]["embedding"][tokens] * math.sqrt(config.d_model) + table


def softmax_by_hand(config, p, xq, xk, mask):
    """[b, h, q, k] per head and example, with Python loops over both."""
    h, d_k = config.num_heads, config.d_k
    project = lambda x, name: x @ p[name]["kernel"] + p[name].get("bias", 0.0)  # noqa: E731
    q = project(xq, "query").reshape(*xq.shape[:2], h, d_k)
    k = project(xk, "key").reshape(*xk.shape[:2], h, d_k)
    out = np.zeros((xq.shape[0], h, xq.shape[1], xk.shape[1]))
    for b in range(xq.shape[0]):
        for head in range(h):
            scores = q[b, :, head] @ k[b, :, head].T / math.sqrt(d_k)
            scores = np.where(mask[b], scores, -np.inf)
            e = np.exp(scores - scores.max(-1, keepdims=True))
            out[b, head] = e / e.sum(-1, keepdims=True)
    return out


@pytest.mark.parametrize(
    "name", [n if n == "post" else pytest.param(n, marks=pytest.mark.slow) for n in sorted(CONFIGS)]
)  # one fast
def test_weights_equal_a_softmax_of_the_models_own_query_and_key_projections(name):
    config = CONFIGS[name]
    params = init(config)
    got = jax.device_get(attention_weights.teacher_forced_weights(config, params, INPUTS, TARGETS))
    want = by_hand(config, params, INPUTS, TARGETS)
    real = {"encoder": INPUTS != PAD_ID, "decoder": TARGETS != PAD_ID, "cross": TARGETS != PAD_ID}  # query rows
    for kind in attention_weights.KINDS:
        assert got[kind].shape == want[kind].shape == (2, config.num_layers, config.num_heads, *want[kind].shape[3:])
        for b in range(2):
            np.testing.assert_allclose(
                got[kind][b][:, :, real[kind][b]],
                want[kind][b][:, :, real[kind][b]],
                atol=2e-6,
                err_msg=f"{name} {kind} row {b}",
            )


def test_rows_sum_to_one_and_masked_keys_get_exactly_zero():
    config = CONFIGS["post"]
    got = jax.device_get(attention_weights.teacher_forced_weights(config, init(config), INPUTS, TARGETS))
    source_keys, target_keys = INPUTS != PAD_ID, TARGETS != PAD_ID
    future = np.triu(np.ones((TARGETS.shape[1],) * 2, bool), k=1)
    for kind, queries, keys in (
        ("encoder", source_keys, source_keys),
        ("decoder", target_keys, target_keys),
        ("cross", target_keys, source_keys),
    ):
        for b in range(2):
            w = got[kind][b][:, :, queries[b]]  # [N, h, real queries, k]
            np.testing.assert_allclose(w[..., keys[b]].sum(-1), 1.0, atol=1e-6)
            assert (w[..., ~keys[b]] == 0).all(), kind  # padding: exactly 0
            if kind == "decoder":
                assert (w[..., future[queries[b]]] == 0).all()  # the future: exactly 0
                assert (w[..., ~future[queries[b]] & keys[b]] > 0).all()  # and everything else seen


def test_weights_do_not_change_with_the_batch_they_come_in():
    config = CONFIGS["pre"]
    params = init(config)
    short_source, short_target = np.array([[5, 6, 7, 3]]), np.array([[8, 9, 3]])
    alone = jax.device_get(attention_weights.teacher_forced_weights(config, params, short_source, short_target))
    long_source = np.array([[10, 11, 12, 13, 14, 15, 16, 3]])
    long_target = np.array([[17, 18, 19, 20, 21, 3]])
    pad = lambda a, n: np.pad(a, ((0, 0), (0, n - a.shape[1])))  # noqa: E731
    batch = jax.device_get(
        attention_weights.teacher_forced_weights(
            config,
            params,
            np.concatenate([pad(short_source, 8), long_source]),
            np.concatenate([pad(short_target, 6), long_target]),
        )
    )
    s, t = short_source.shape[1], short_target.shape[1]
    shapes = {"encoder": (s, s), "decoder": (t, t), "cross": (t, s)}
    for kind, (q, k) in shapes.items():
        np.testing.assert_allclose(batch[kind][0, :, :, :q, :k], alone[kind][0], atol=1e-6, err_msg=kind)
        assert (batch[kind][0, :, :, :q, k:] == 0).all()  # the padding beside it gets nothing


@pytest.fixture(scope="module")
def untrained(corpus, data_dir):
    """A Restored run with random parameters over the small corpus's tokenizer (no training)."""
    _, _, tokenizer = corpus
    config = small_config(data_dir)
    model_config = dataclasses.replace(CONFIGS["post"], vocab_size=tokenizer.vocab_size)
    model = Transformer(model_config)
    params = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"]
    return inference.Restored(config, model, tokenizer, params, [7], parallel.data_mesh())


def test_weights_of_a_pair_carry_its_wordpieces_and_refuse_what_does_not_fit(untrained):
    run = untrained
    w = attention_weights.pair_weights(run, "The dog sees the ☃.", "Der Hund sieht den Mann.")
    sp = run.tokenizer.sp
    source_ids = sp.encode("The dog sees the ☃.") + [EOS_ID]
    assert w.source_tokens == [sp.id_to_piece(i) for i in source_ids] and w.source_tokens[-1] == "</s>"
    assert "<unk>" in w.source_tokens  # an unknown character, as the tokenizer maps it
    assert w.decoder_inputs[0] == "<s>" and w.decoder_inputs[1:] == w.target_tokens[:-1]
    assert w.target_tokens[-1] == "</s>" and not w.translated
    s, t = len(w.source_tokens), len(w.target_tokens)
    L, h = run.model.config.num_layers, run.model.config.num_heads
    assert w.encoder.shape == (L, h, s, s) and w.decoder.shape == (L, h, t, t) and w.cross.shape == (L, h, t, s)
    # the pair's weights, as a float64 softmax of the model's own projections of these wordpieces gives them
    want = by_hand(run.model.config, run.params, np.array([source_ids]), np.array([run.tokenizer.encode(w.target)]))
    for kind in attention_weights.KINDS:
        np.testing.assert_allclose(getattr(w, kind), want[kind][0], atol=2e-6, err_msg=kind)
    saved = json.loads(json.dumps(w.to_json()))
    assert saved["tokens"]["source"] == w.source_tokens
    np.testing.assert_allclose(np.array(saved["weights"]["decoder"]), w.decoder, atol=1e-7)

    limit = run.model.config.max_len
    long = " ".join(["the dog"] * limit)
    for source, target, words in (
        (long, "Der Hund.", f"at most {limit} (model.max_len {limit})"),
        ("The dog.", long, "The target has"),
        (" ", "Der Hund.", "The source sentence is empty"),
        ("The dog.", "", "The target sentence is empty"),
    ):
        with pytest.raises(UserError, match=None) as e:
            attention_weights.pair_weights(run, source, target)
        assert words in str(e.value) and str(e.value).count(". ") == 0, str(e.value)


def synthetic(encoder, decoder, cross, source=4, target=3):
    tokens = lambda n, end: [f"t{i}" for i in range(n - 1)] + [end]  # noqa: E731
    return attention_weights.Weights(
        "s",
        "t",
        False,
        tokens(source, "</s>"),
        ["<s>", *tokens(target, "x")[:-1]],
        tokens(target, "</s>"),
        encoder,
        decoder,
        cross,
    )


def test_summary_names_the_place_each_head_looks_and_its_entropy():
    s, t = 4, 3
    previous = np.eye(s, k=-1)
    previous[0, 0] = 1.0  # the first token has no previous one
    uniform_causal = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    end = np.zeros((t, s))
    end[:, -1] = 1.0
    w = synthetic(
        np.stack([np.stack([previous, np.full((s, s), 1 / s)])]),
        np.stack([np.stack([uniform_causal, np.eye(t)])]),
        np.stack([np.stack([end, np.full((t, s), 1 / s)])]),
    )
    rows = {(r["kind"], r["head"]): r for r in attention_maps.head_summary(w)}
    assert rows["encoder", 1]["attends_most_to"] == "previous token" and rows["encoder", 1]["share"] == 0.75
    assert rows["encoder", 1]["entropy_bits"] == 0
    assert rows["encoder", 2]["entropy_bits"] == pytest.approx(2.0)  # log2 of 4 keys
    # the causal uniform head: row i spreads over i + 1 keys, log2(i + 1) bits; its strongest key is <s>
    assert rows["decoder", 1]["entropy_bits"] == pytest.approx(np.mean(np.log2(np.arange(1, t + 1))), abs=1e-4)
    assert rows["decoder", 1]["attends_most_to"] == "start of sentence"
    assert rows["decoder", 2]["attends_most_to"] == "self"  # each position itself; the first is <s>
    assert rows["decoder", 2]["share"] == pytest.approx(2 / 3, abs=1e-4)
    assert rows["cross", 1]["attends_most_to"] == "end of sentence"
    text = attention_maps.summary_table(attention_maps.head_summary(w))
    assert "encoder self-attention" in text and "previous token (75%)" in text


def test_figures_reach_a_gs_workdir_as_urls(untrained, fake_bucket):
    w = attention_weights.pair_weights(untrained, "The dog sees the man.", "Der Hund sieht den Mann.")
    out = "gs://bucket/w/attention/x"
    attention_maps.draw_grid(w, "cross", f"{out}/cross.png", "test", dpi=40)
    attention_maps.draw_lines(w, "encoder", 1, [1, 2], f"{out}/lines.png", "test", dpi=40)
    for name in ("cross.png", "lines.png"):
        data = FakeBucket.store[f"bucket/w/attention/x/{name}"].getvalue()
        assert data.startswith(b"\x89PNG") and len(data) > 1000


# ---------------------------------------------------------------------------------------------
# The command, on the run trained with 8 fake devices (slow: subprocesses)


def command(module, *args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env_with_devices(1), capture_output=True, text=True, input=stdin
    )


def files_of(root):
    return {p.relative_to(root): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


SOURCE = "Today the woman buys a book."


@pytest.mark.slow
def test_command_prints_translates_translation_and_writes_only_under_attention(eight_device_workdir, tmp_path):
    workdir = tmp_path / "w"
    shutil.copytree(eight_device_workdir, workdir)
    before = files_of(workdir)
    for flags in ((), ("--config.decode.beam_size=2", "--config.decode.alpha=1.0")):
        translated = command("fxformer.translate", f"--workdir={workdir}", "--step=20", *flags, stdin=SOURCE + "\n")
        assert translated.returncode == 0, translated.stderr[-3000:]
        result = command(
            "fxformer.attention_maps",
            f"--workdir={workdir}",
            "--step=20",
            f"--source={SOURCE}",
            "--json",
            "--name=n",
            *flags,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"translation: {translated.stdout.strip()}\n" in result.stdout
    out = workdir / "attention" / "n"
    saved = json.loads((out / "weights.json").read_text())
    assert saved["target"] == translated.stdout.strip() and saved["translated"] and saved["checkpoint_steps"] == [20]
    summary = json.loads((out / "summary.json").read_text())["heads"]
    assert len(summary) == 3 * 1 * 2  # three kinds x 1 layer x 2 heads (the tiny model)
    assert "encoder-decoder attention" in result.stdout and "attends most to" in result.stdout
    for name in ("encoder.png", "decoder.png", "cross.png", "lines-encoder-layer1-all.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG"), name
    averaged = command(
        "fxformer.attention_maps",
        f"--workdir={workdir}",
        "--average_last=2",
        f"--source={SOURCE}",
        "--target=Heute kauft die Frau ein Buch.",
        "--view=lines",
        "--head=2",
    )
    assert averaged.returncode == 0, averaged.stderr[-3000:]
    assert (workdir / "attention" / "today-the-woman-buys-a-book-20-avg2" / "lines-encoder-layer1-head2.png").exists()
    after = files_of(workdir)
    assert {p: m for p, m in after.items() if p.parts[0] != "attention"} == before  # nothing else written


@pytest.mark.slow
def test_command_refuses_in_one_sentence(eight_device_workdir, tmp_path, monkeypatch):
    """Through the command: --help, and refusals before and after the restore, one line each (status
    2, no traceback: `cli.run`). The other refusals in-process, as the UserError the command prints."""
    helped = command("fxformer.attention_maps", "--help")
    assert helped.returncode == 0 and "--source" in helped.stdout and "W/attention/<name>/" in helped.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    for name in ("config.json", "tokenizer.model"):
        shutil.copy(eight_device_workdir / name, empty / name)
    w = f"--workdir={eight_device_workdir}"
    for args, words in (
        ([f"--workdir={empty}", "--source=The dog."], "holds no checkpoint"),
        (
            [w, "--source=The dog.", "--dpi=3000"],
            "--dpi=3000 is not a resolution; give dots per inch above 0 and below 2000",
        ),
    ):
        with left_as_is(empty, eight_device_workdir):
            result = command("fxformer.attention_maps", *args)
        assert result.returncode == exitcodes.USER_ERROR and "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], result.stderr
    for args, words in (
        ([w, "--source= "], "The source sentence is empty"),
        ([w, "--source=" + "the dog " * 100], "wordpieces (with the end-of-sentence mark) but"),
        ([w, "--source=The dog.", "--layer=2"], "--layer=2 does not exist: this model has 1 layers"),
        ([w, "--source=The dog.", "--head=3"], "--head=3 does not exist"),
        ([w, "--source=The dog.", "--name=../x"], "not a plain folder name"),
        ([w, "--source=The dog.", "--dpi=nan"], "--dpi=nan is not a resolution"),
        ([w, "--source=The dog.", "--dpi=0"], "--dpi=0 is not a resolution"),
    ):
        assert words in refused_in_process(monkeypatch, attention_maps.main, args, eight_device_workdir), args


@pytest.mark.slow  # restores a trained run in-process
def test_a_gs_workdir_gets_its_figures_in_the_bucket(eight_device_workdir, fake_gcs, tmp_path, monkeypatch, capsys):  # noqa: F811
    bucket = epath.Path("gs://bucket/w")
    for name in ("config.json", "tokenizer.model"):
        (bucket / name).write_bytes((eight_device_workdir / name).read_bytes())
    (bucket / "checkpoints").mkdir(parents=True)
    shutil.copytree(eight_device_workdir / "checkpoints", tmp_path / "mirror" / "bucket" / "w" / "checkpoints")
    monkeypatch.chdir(tmp_path)  # a stray local "gs:" folder would appear here
    monkeypatch.setattr(
        sys, "argv", ["attention", "--workdir=gs://bucket/w", "--step=20", f"--source={SOURCE}", "--name=n", "--json"]
    )
    attention_maps.main()
    translated = capsys.readouterr().out.splitlines()[0].removeprefix("translation: ")
    written = {key.removeprefix("bucket/w/attention/n/") for key in FakeBucket.store if "/attention/" in key}
    assert written == {
        "encoder.png",
        "decoder.png",
        "cross.png",
        "lines-encoder-layer1-all.png",
        "summary.json",
        "weights.json",
    }
    assert json.loads((bucket / "attention" / "n" / "weights.json").read_text())["target"] == translated
    assert fake_gcs == ["gs://bucket/w/checkpoints"] and not list(tmp_path.rglob("gs:*"))


@pytest.mark.slow  # traces 20 models (shapes only)
def test_every_table3_row_gives_weights_of_its_layers_heads_and_lengths():
    inputs, targets = np.ones((1, 7), np.int32), np.ones((1, 5), np.int32)
    for row in table3.ROWS:
        config = TransformerConfig.from_config(table3.get_config(row).model, vocab_size=37)
        params = jax.eval_shape(Transformer(config).init, jax.random.key(0), inputs, targets)["params"]
        if row == "base":  # the fused kernel never forms the weights: the reference attention is used
            config = dataclasses.replace(config, attention_impl="cudnn")
        weights = functools.partial(attention_weights.teacher_forced_weights, config)
        got = jax.eval_shape(weights, params, inputs, targets)
        n, h = config.num_layers, config.num_heads
        assert {kind: a.shape for kind, a in got.items()} == {
            "encoder": (1, n, h, 7, 7),
            "decoder": (1, n, h, 5, 5),
            "cross": (1, n, h, 5, 7),
        }, row
