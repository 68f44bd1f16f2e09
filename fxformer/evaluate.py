"""Checkpoint(s) -> per-wordpiece perplexity and sacreBLEU, the way the paper measured them.

    python -m fxformer.evaluate --workdir=runs/default
    python -m fxformer.evaluate --workdir=runs/base --split=test --average_last=5 --beam_size=4 --alpha=0.6

Restores onto the devices at hand, whatever count trained the run. Writes
`W/eval/<split>-<step>.json` (bleu, ppl, num_sentences, checkpoint_steps, sacreBLEU's
signature, ...) and the detokenized translations beside it (`.hyp.txt`, with `.ref.txt`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import NamedTuple

import jax
import ml_collections
import sacrebleu

from fxformer import checkpoint, cli, parallel, paths, train
from fxformer.data import corpora, pipeline
from fxformer.data.tokenizer import Tokenizer
from fxformer.inference import bleu as corpus_bleu
from fxformer.inference import source_length, translate_examples, translator
from fxformer.model import Transformer


class Restored(NamedTuple):
    """A training workdir, ready for inference."""

    config: ml_collections.ConfigDict
    model: Transformer
    tokenizer: Tokenizer
    params: dict
    steps: list[int]  # the checkpoint steps whose parameters these are (averaged if several)
    mesh: jax.sharding.Mesh
    eval_step: Callable  # jitted (params, batch) -> summed loss / nll / accuracy / tokens


def restore_for_inference(workdir: paths.PathLike, step: int | str = 0, average_last: int = 0, log=print) -> Restored:
    """A workdir's config, model, tokenizer and parameters, on the devices at hand.

    `step` picks one checkpoint ("best": the best dev metric seen in training, `W/best`);
    `average_last` > 1 averages the last k (saved once under
    `W/averaged/last<k>/<last step>` and reused); neither: the config's `average_last`.
    """
    workdir = paths.Workdir(workdir)
    config = train.load_workdir_config(workdir)
    if not workdir.tokenizer.exists():
        raise cli.UserError(f"{workdir} has no tokenizer.model; is it a training workdir?")
    tokenizer = Tokenizer(workdir.tokenizer)
    mesh = parallel.data_mesh()
    model, _, abstract_state, eval_step = train.build(config, tokenizer.vocab_size, mesh)
    if step == "best":
        return Restored(config, model, tokenizer, *best_params(workdir, abstract_state, log), mesh, eval_step)
    directory = workdir.checkpoints
    if not directory.exists():
        raise cli.UserError(f"{directory} holds no checkpoint; train first.")
    with checkpoint.manager(directory, asynchronous=False) as mngr:
        steps = list(mngr.all_steps())
        if not steps:
            raise cli.UserError(f"{directory} holds no checkpoint; train first.")
        if step:
            if step not in steps:
                raise cli.UserError(f"No checkpoint at step {step} in {directory}; there are {steps}.")
            chosen = [step]
        else:
            k = average_last or config.average_last
            chosen = steps[-k:]
            if len(chosen) < k:
                log(f"warning: averaging the {len(chosen)} checkpoints there are, not {k}")
        if len(chosen) == 1:
            params = checkpoint.restore(mngr, chosen[0], abstract_state).params
        else:
            params = averaged(workdir, mngr, chosen, abstract_state, log)
    return Restored(config, model, tokenizer, params, chosen, mesh, eval_step)


def best_params(workdir: paths.Workdir, abstract_state, log=print) -> tuple[dict, list[int]]:
    """The parameters kept in `W/best` (best dev metric during training) and their step."""
    if not workdir.best.exists():
        raise cli.UserError(f"{workdir} kept no best checkpoint (config best_metric, set at training); give --step=N.")
    with checkpoint.manager(workdir.best, asynchronous=False) as mngr:
        step = mngr.latest_step()
        if step is None:
            raise cli.UserError(f"{workdir.best} holds no checkpoint yet; it is written at the first dev evaluation.")
        params, meta = checkpoint.restore_params(mngr, step, abstract_state.params)
    log(f"best checkpoint: step {step}, {meta['metric']} {meta['value']:.4g}")
    return params, [step]


def averaged(workdir: paths.Workdir, mngr, steps: list[int], abstract_state, log=print):
    """The mean parameters of `steps`: from `W/averaged/last<k>/<last step>` if written before, else computed there."""
    directory = workdir.averaged(len(steps))
    with checkpoint.manager(directory, asynchronous=False) as avg:
        if steps[-1] in avg.all_steps():
            params, meta = checkpoint.restore_params(avg, steps[-1], abstract_state.params)
            if meta["checkpoint_steps"] == steps:
                return params
            avg.delete(steps[-1])  # averaged from other checkpoints (keep_checkpoints changed): redo
        log(f"averaging the parameters of steps {steps}")
        params = checkpoint.average_params(mngr, steps, abstract_state)
        checkpoint.save_params(avg, steps[-1], params, {"checkpoint_steps": steps})
    return params


def evaluate(
    workdir: paths.PathLike,
    split: str = "test",
    step: int | str = 0,
    average_last: int = 0,
    beam_size: int | None = None,
    alpha: float | None = None,
    limit: int = 0,
    log=print,
) -> dict:
    """Perplexity and sacreBLEU of a workdir's checkpoint(s) on `split`; writes and returns the results."""
    workdir = paths.Workdir(workdir)
    paths.check_workdir(workdir)
    if jax.process_index() == 0:  # before any work: the results are written at the end
        paths.check_writable(workdir.eval, "evaluation writes its results")
    config, model, tokenizer, params, steps, mesh, eval_step = restore_for_inference(workdir, step, average_last, log)
    beam_size = beam_size or config.beam_size
    alpha = config.alpha if alpha is None else alpha
    data: ml_collections.ConfigDict = config.data
    source = corpora.data_source(corpora.prepare(data, log=log), split)
    n = len(source) if limit <= 0 else min(limit, len(source))
    examples = pipeline.tokenize_split(source, tokenizer, data, n)
    references = [source[i][data.target_lang].decode("utf-8") for i in range(n)]

    losses = train.evaluate_loss(eval_step, params, examples, config, mesh, model.config.max_len)
    length = source_length(examples, model, config.max_decode_extra, log)
    translate = translator(model, mesh, beam_size, alpha, config.max_decode_extra)
    hypotheses = translate_examples(
        translate, params, examples, tokenizer, data.eval_batch_size, length, mesh, f"beam search ({split})"
    )
    score, signature = corpus_bleu(hypotheses, references)
    chrf = sacrebleu.metrics.CHRF().corpus_score(hypotheses, [references])

    name = (
        f"{split}-{steps[-1]}" + (f"-avg{len(steps)}" if len(steps) > 1 else "") + ("-best" if step == "best" else "")
    )
    if n < len(source):
        name += f"-first{n}"  # a partial evaluation never overwrites the full one
    results = {
        "bleu": score.score,
        "chrf": chrf.score,
        "ppl": losses["ppl"],
        "nll": losses["nll"],
        "loss": losses["loss"],
        "accuracy": losses["accuracy"],
        "num_sentences": n,
        "split": split,
        "checkpoint_steps": steps,
        "beam_size": beam_size,
        "alpha": alpha,
        "sacrebleu": str(score),
        "signature": signature,
        "num_params": sum(x.size for x in jax.tree.leaves(params)),
        "devices": jax.device_count(),
    }
    if jax.process_index() == 0:
        out = workdir.eval
        out.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(out / f"{name}.hyp.txt", "".join(h + "\n" for h in hypotheses))
        paths.write_atomic(out / f"{name}.ref.txt", "".join(r + "\n" for r in references))
        paths.write_atomic(out / f"{name}.json", json.dumps(results, indent=2) + "\n")
        results["path"] = str(out / f"{name}.json")
    return results


def inference_parser(description: str, module: str):
    """Flags shared by evaluate and translate: the workdir, which checkpoint(s), the beam."""
    p = cli.parser(description, module, config=False)
    p.add_argument("--workdir", required=True, help="a training run directory")
    p.add_argument("--step", default="0", help="use this checkpoint step, or 'best' (best dev metric in training)")
    p.add_argument("--average_last", type=int, default=0, help="average the last K checkpoints (default: config)")
    p.add_argument("--beam_size", type=int, default=0, help="beam size (default: config, 4)")
    p.add_argument("--alpha", type=float, default=None, help="length penalty alpha (default: config, 0.6)")
    parallel.add_cluster_flags(p)
    return p


def parse_inference_args(p):
    args, _ = cli.parse(p)
    if args.step != "best":
        if not args.step.lstrip("-").isdigit():
            raise cli.UserError(f"--step takes a step number or 'best', not '{args.step}'.")
        args.step = int(args.step)
    if args.step != "best" and args.step < 0 or args.average_last < 0:
        raise cli.UserError("--step and --average_last must be positive (or left out).")
    if args.step and args.average_last:
        raise cli.UserError("Give --step or --average_last, not both.")
    if args.beam_size < 0 or (args.alpha is not None and args.alpha < 0):
        raise cli.UserError("--beam_size must be at least 1 and --alpha at least 0.")
    parallel.join_cluster(args)
    return args


def main() -> None:
    p = inference_parser(__doc__, "fxformer.evaluate")
    p.add_argument("--split", default="test", help="dataset split: test (newstest2014), validation, ...")
    p.add_argument("--limit", type=int, default=0, help="evaluate the first N sentences only")
    args = parse_inference_args(p)
    r = evaluate(args.workdir, args.split, args.step, args.average_last, args.beam_size, args.alpha, args.limit)
    print(f"{r['split']}: {r['num_sentences']:,} sentences, checkpoint step(s) {r['checkpoint_steps']}")
    print(f"perplexity (per wordpiece): {r['ppl']:.3f}")
    print(r["sacrebleu"])
    print(f"sacreBLEU signature: {r['signature']}")
    print(f"BLEU {r['bleu']:.2f}, chrF {r['chrf']:.2f}; results in {r.get('path', args.workdir)}")


if __name__ == "__main__":
    cli.run(main)
