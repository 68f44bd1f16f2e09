"""Orbax checkpoints: save (async, sharded), restore onto any device count, average.

A training checkpoint `W/checkpoints/<step>` holds two items: `state` (step, parameters,
optimizer state, RNG key) and `data` (the grain iterator's position, one file per process).
Inference reads only the `params` subtree of `state`. An averaged checkpoint
`W/averaged/last<k>/<step>` (and the best one, `W/best/<step>`) holds `params` and `meta`
(the steps averaged; the metric).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Literal

import grain
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

from fxformer import metrics, paths
from fxformer.errors import UserError


def open_manager(directory: epath.Path, keep: int = 0, asynchronous: bool = True) -> ocp.CheckpointManager:
    """A manager over `directory` (an absolute local path, as a `paths.Workdir`'s parts are, or a
    URL) keeping the last `keep` steps (0 = all)."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep or None, enable_async_checkpointing=asynchronous, create=True
    )
    return ocp.CheckpointManager(directory, options=options)


TEMPORARY = ".orbax-checkpoint-tmp"  # in the name of a save that never finished


def remove_unfinished(directory: epath.Path, complete: list[int], log=print) -> None:
    """Delete the saves that never finished (a kill during a save): temporary directories on a disk,
    step directories without orbax's commit file in a bucket (`complete`: the finished steps, as the
    manager's `all_steps()` or `paths.complete_steps` list them)."""
    if not directory.exists():
        return
    for path in directory.iterdir():
        if TEMPORARY in path.name or path.name.isdigit() and int(path.name) not in complete:
            log(f"removing {path}: a save that never finished")
            path.rmtree() if path.is_dir() else path.unlink()


class SaveFailed(UserError):
    """A checkpoint could not be written (a full disk, a lost bucket); the earlier ones are intact."""


def save_failed(directory: epath.Path, step: int | None, error: BaseException) -> SaveFailed:
    """One sentence: why the save failed and which checkpoint the next run resumes from."""
    text = str(error)
    in_text = (words for code, words in paths.UNWRITABLE.items() if os.strerror(code) in text)  # orbax wraps OSErrors
    reason = paths.unwritable(error) or next(
        in_text, f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"
    )
    if step is None:  # the save that failed is the one left unfinished
        names = [p.name for p in directory.iterdir()] if directory.exists() else []  # absent: the workdir was removed
        unfinished = [name.split(".")[0] for name in names if TEMPORARY in name]
        step = int(unfinished[-1]) if unfinished and unfinished[-1].isdigit() else None
    done = [s for s in paths.complete_steps(directory) if s != step]
    last = f"the last complete checkpoint is {directory}/{done[-1]}" if done else "no checkpoint is complete"
    what = f"Saving step {step}" if step is not None else "A save"
    return SaveFailed(
        f"{what} to {directory} failed ({reason}); {last}: free space there (or fix the directory) and run the "
        "same command to resume from it."
    )


def save(manager: ocp.CheckpointManager, step: int, state, data_iterator=None) -> None:
    """Start writing `state` (and the data iterator's position) at `step`; returns before it is
    written. A failure of an earlier background save is raised here (or by `check`, `wait`) as SaveFailed."""
    items = {"state": ocp.args.StandardSave(state)}
    if data_iterator is not None:
        items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    try:
        manager.save(step, args=ocp.args.Composite(**items), force=True)
    except Exception as e:  # noqa: BLE001 - orbax wraps OS errors in ValueError / RuntimeError
        raise save_failed(manager.directory, None, e) from None


def check(manager: ocp.CheckpointManager) -> None:
    """Raise SaveFailed now if a background save has failed (cheap: no waiting)."""
    try:
        manager.check_for_errors()
    except Exception as e:  # noqa: BLE001
        raise save_failed(manager.directory, None, e) from None


def wait(manager: ocp.CheckpointManager) -> None:
    """Block until the background save is written; SaveFailed if it was not."""
    try:
        manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001
        raise save_failed(manager.directory, None, e) from None


def remove_from(manager: ocp.CheckpointManager, step: int) -> int | None:
    """Delete the checkpoints at `step` and after (once written); the latest step left, or None."""
    wait(manager)
    for saved in manager.all_steps():
        if saved >= step:
            manager.delete(saved)
    return manager.latest_step()


def close(manager: ocp.CheckpointManager, failing: bool = False) -> None:
    """Wait for the last save and close; `failing` (the run is already stopping on an error):
    a second failure is not reported."""
    try:
        wait(manager)
        manager.close()
    except SaveFailed:
        if not failing:
            raise


def settle(manager: ocp.CheckpointManager) -> None:
    """Close `manager` after a failed save too, which waits for the rest of that save's writes:
    orbax reports a save's first error while its other writes go on, creating the directories
    they write into. Any error here is the failure already reported."""
    with contextlib.suppress(Exception):
        manager.close()


def restore_training_state(manager: ocp.CheckpointManager, step: int, abstract_state, data_iterator=None):
    """The state at `step`, laid out as `abstract_state` says (its shardings pick the devices).

    `data_iterator`, if given, is moved to the saved position.
    """
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
        items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    return _restore(manager, step, items, abstract_state.params, resuming=data_iterator is not None)["state"]


def training_params(manager: ocp.CheckpointManager, step: int, abstract_params):
    """The parameters of the state at `step`, laid out as `abstract_params` says, read alone: a
    partial restore of the state's `params` subtree (Adam's moments, the step and the RNG key
    are not read). `manager` must not save or restore whole states: orbax binds an item to one
    handler per manager."""
    return _state_part(manager, step, {"params": abstract_params}, abstract_params)["params"]


def _state_part(manager: ocp.CheckpointManager, step: int, item: dict, abstract_params) -> dict:
    """The subtrees `item` names of the state at `step`, laid out as it says, read alone (a partial
    restore: nothing else of the state is read)."""
    state = ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True
    )
    return _restore(manager, step, {"state": state}, abstract_params, resuming=False)["state"]


def _restore(manager: ocp.CheckpointManager, step: int, items: dict, abstract_params, resuming: bool) -> dict:
    """`items` of the training checkpoint at `step`; a different model, a missing or damaged
    checkpoint is one sentence (`resuming`: for train, which has no --step)."""
    mismatch = shape_mismatch(manager.directory, step, abstract_params)
    if mismatch:
        raise UserError(
            f"Checkpoint {manager.directory}/{step} holds a different model ({mismatch}); the checkpoint is intact: "
            "use the workdir's own tokenizer.model and config, or a new --workdir."
        )
    try:
        return manager.restore(step, args=ocp.args.Composite(**items))
    except FileNotFoundError:
        raise UserError(f"Checkpoint {manager.directory}/{step} is missing or incomplete.") from None
    except Exception as e:  # orbax raises bare Exception / ValueError / JSONDecodeError for damaged files
        if resuming and "process_" in str(e):
            raise UserError(data_position_problem(manager.directory, step)) from None
        fix = "delete that step's directory or pick another with --step"  # evaluate, translate
        if resuming:  # train, which has no --step
            fix = "delete that step's directory to resume from the one before it"
        raise UserError(f"Checkpoint {manager.directory}/{step} is unreadable ({type(e).__name__}); {fix}.") from None


def shape_mismatch(directory, step: int, abstract_params) -> str | None:
    """How the parameters saved at `step` differ from the model's ('embedding 400 x 32 in the
    checkpoint vs 300 x 32'), or None when they match or the metadata cannot be read (then the
    restore itself reports what is wrong)."""
    try:
        meta = ocp.PyTreeCheckpointHandler().metadata(directory / str(step) / "state")
        saved_tree = getattr(meta, "tree", meta)["params"]
    except Exception:  # noqa: BLE001 - unreadable metadata: the restore names the damage
        return None
    name = lambda path: "/".join(str(getattr(k, "key", k)) for k in path)  # noqa: E731
    saved = {name(p): tuple(leaf.shape) for p, leaf in jax.tree_util.tree_leaves_with_path(saved_tree)}
    wanted = {name(p): tuple(x.shape) for p, x in jax.tree_util.tree_leaves_with_path(abstract_params)}
    size = lambda shape: " x ".join(map(str, shape)) or "a scalar"  # noqa: E731
    for key, shape in wanted.items():
        if key not in saved:
            return f"{key} is not in the checkpoint"
        if saved[key] != shape:
            return f"{key} is {size(saved[key])} in the checkpoint vs {size(shape)}"
    extra = sorted(set(saved) - set(wanted))
    return f"{extra[0]} is in the checkpoint but not in the model" if extra else None


def data_position_problem(directory: epath.Path, step: int) -> str:
    """Why the data iterator's position at `step` cannot be read, in one sentence."""
    data = directory / str(step) / "data"
    saved = sorted(p.name for p in data.iterdir() if p.name.startswith("process_")) if data.exists() else []
    counts = {name.rsplit("-of-", 1)[-1].removesuffix(".json") for name in saved}
    if counts and counts != {str(jax.process_count())}:
        return (
            f"Checkpoint {directory}/{step} was written by {', '.join(sorted(counts))} process(es), not "
            f"{jax.process_count()}; resume with the same process count."
        )
    return (
        f"Checkpoint {directory}/{step} lacks this process's data position ({data}/process_{jax.process_index()}"
        f"-of-{jax.process_count()}.json); the parameters are intact: restore that file, or resume from another "
        "checkpoint by moving this step's directory aside."
    )


def abstract_like(tree, sharding) -> object:
    """Shapes and dtypes of `tree` (arrays or ShapeDtypeStructs), each placed with `sharding`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def average_params(manager: ocp.CheckpointManager, steps: list[int], abstract_params) -> dict:
    """The element-wise mean of the parameters saved at `steps` (the paper averages the last 5 or
    20), each read alone (`training_params`)."""
    total = None
    for step in steps:
        params = training_params(manager, step, abstract_params)
        total = params if total is None else jax.tree.map(jnp.add, total, params)
    return jax.tree.map(lambda x: x / len(steps), total)


def written_at(directory: epath.Path, steps: list[int]) -> list[int | None]:
    """When orbax finished writing each of `steps` (its `_CHECKPOINT_METADATA`; None where an older
    orbax recorded no such time), so that a step written again (a retrained run, a resume after
    divergence) is told from the one seen before."""
    times = []
    for step in steps:
        path = directory / str(step) / "_CHECKPOINT_METADATA"
        try:
            times.append(json.loads(path.read_text()).get("commit_timestamp_nsecs"))
        except (OSError, ValueError, AttributeError):  # an older orbax's checkpoint: no such record
            times.append(None)
    return times


def save_params(manager: ocp.CheckpointManager, step: int, params, meta: dict) -> None:
    """Write parameters alone (an averaged checkpoint, or the best) with a JSON description, and wait."""
    args = ocp.args.Composite(params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta))
    manager.save(step, args=args, force=True)
    manager.wait_until_finished()


def kept_params(
    manager: ocp.CheckpointManager, step: int, abstract_params, kind: str = "averaged"
) -> tuple[dict, dict]:
    """Parameters and description of parameters kept apart from training (`save_params`): an
    average of training checkpoints (`W/averaged/last<k>`, kind "averaged", a cache) or the best
    by dev metric (`W/best`, kind "best", which nothing else holds), or the parameters a fine-tuning
    run starts from (`W/imported`, kind "imported")."""
    args = ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params), meta=ocp.args.JsonRestore())
    try:
        out = manager.restore(step, args=args)
    except Exception as e:
        where = f"{manager.directory}/{step}"
        if kind == "imported":
            raise UserError(
                f"The imported parameters {where} are unreadable ({type(e).__name__}): import the model again "
                "into a new workdir (python -m fxformer.importing)."
            ) from None
        if kind == "best":
            raise UserError(
                f"The best checkpoint {where} is unreadable ({type(e).__name__}); nothing else holds those parameters: "
                "restore it from a copy, or evaluate a training checkpoint instead (--step=latest or --step=N)."
            ) from None
        raise UserError(
            f"Averaged checkpoint {where} is unreadable ({type(e).__name__}); it is only a cache: "
            f"delete {where} and it is averaged again from the training checkpoints."
        ) from None
    return out["params"], out["meta"]


class Best:
    """The parameters with the best dev metric so far, in `W/best/<step>` (model selection on dev),
    kept apart from the rotating last K: lower is better for perplexity and loss, higher for
    accuracy and BLEU. A resumed run keeps competing with the best saved before (early stopping,
    which counts the same evaluations, is `fxformer.early`'s)."""

    def __init__(self, directory: paths.PathLike, metric: str, resume_step: int):
        """A best saved after `resume_step` (after the last checkpoint) is removed: the resumed run
        retraces that future."""
        self.metric = metric
        self.manager = open_manager(directory, keep=1, asynchronous=False) if metric else None
        self.value = None
        if self.manager is not None and self.manager.latest_step() is not None:
            step = self.manager.latest_step()
            meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            if step > resume_step or meta.get("metric") != metric:  # a future this run retraces, or another metric
                self.manager.delete(step)
            else:
                self.value = meta["value"]

    def better(self, value: float) -> bool:
        if self.value is None:
            return True
        return value > self.value if self.metric in metrics.HIGHER_IS_BETTER else value < self.value

    def offer(self, step: int, metrics: dict, params, log=print) -> None:
        """Keep `params` if `metrics[metric]` beats the best so far."""
        if self.manager is None or self.metric not in metrics:
            return
        if not self.better(metrics[self.metric]):
            return
        self.value = float(metrics[self.metric])
        save_params(self.manager, step, params, {"metric": self.metric, "value": self.value, "step": step})
        log(f"best {self.metric} so far ({self.value:.4g}): parameters of step {step} kept in {self.manager.directory}")

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()


# ---------------------------------------------------------------------------------------------
# A workdir's parameters: one checkpoint, the average of k, or the best


def workdir_params(
    workdir: paths.Workdir,
    step: int | str,
    k: int,
    abstract_params,
    *,
    log=print,
    keep_average: bool = True,
    interval: int = 1,
) -> tuple[dict, list[int]]:
    """The parameters a workdir's checkpoints hold, and their steps: those kept in `W/best` (`step`
    "best"), or of the k training checkpoints that end at `step` ("latest" or a number), averaged
    if several (`checkpoint_params`; `interval`: the run's checkpoint interval)."""
    if step == "best":
        return best_params(workdir, abstract_params, log)
    return checkpoint_params(workdir, step, k, abstract_params, log, keep_average, interval)


def apart(steps: list[int], k: int, interval: int) -> tuple[list[int], list[int]]:
    """(the last k of `steps` that are at least half the checkpoint `interval` apart, oldest first;
    the steps passed over). Walking back from the last: a checkpoint a stop wrote a few steps after
    a regular one (a time budget, SIGTERM) would otherwise count nearly the same parameters twice."""
    chosen, skipped = [], []
    for step in reversed(steps):
        if len(chosen) == k:
            break
        if chosen and 2 * (chosen[-1] - step) < interval:
            skipped.append(step)
        else:
            chosen.append(step)
    return chosen[::-1], skipped[::-1]


def checkpoint_params(
    workdir: paths.Workdir,
    step: int | Literal["latest"],
    k: int,
    abstract_params,
    log=print,
    keep_average=True,
    checkpoint_every: int = 1,
) -> tuple[dict, list[int]]:
    """The parameters of the k training checkpoints that end at `step`, at least half the
    checkpoint interval apart (`apart`; averaged if several: `averaged`), and their steps."""
    directory = workdir.checkpoints
    if not directory.exists():
        raise UserError(f"{directory} holds no checkpoint; train first.")
    with open_manager(directory, asynchronous=False) as manager:
        saved = list(manager.all_steps())
        if not saved:
            raise UserError(f"{directory} holds no checkpoint; train first.")
        if step != "latest" and step not in saved:
            raise UserError(f"No checkpoint at step {step} in {directory}; there are {saved}.")
        candidates = [s for s in saved if step == "latest" or s <= step]
        chosen, skipped = apart(candidates, k, checkpoint_every)
        if skipped:
            log(
                f"averaging: skipped step(s) {', '.join(map(str, skipped))}: closer than half the checkpoint interval "
                f"({checkpoint_every} steps) to a later checkpoint averaged"
            )
        if len(chosen) < k:
            log(f"warning: averaging the {len(chosen)} checkpoints there are, not {k}")
        if len(chosen) == 1:
            params = training_params(manager, chosen[0], abstract_params)
        else:
            params = averaged(workdir, manager, chosen, abstract_params, log, keep_average)
    return params, chosen


def smoothed_params(workdir: paths.Workdir, key: str, abstract_params) -> tuple[dict, int]:
    """The moving average of the parameters kept under `key` (`optim.ema_key`) in the optimizer
    state of the latest training checkpoint, read alone (a partial restore), and that step."""
    directory = workdir.checkpoints
    with open_manager(directory, asynchronous=False) as manager:
        step = manager.latest_step()
        if step is None:
            raise UserError(f"{directory} holds no checkpoint; train first.")
        restored = _state_part(manager, step, {"opt_state": {"ema": {key: abstract_params}}}, abstract_params)
    return restored["opt_state"]["ema"][key], step


def best_params(workdir: paths.Workdir, abstract_params, log=print) -> tuple[dict, list[int]]:
    """The parameters kept in `W/best` (best dev metric during training) and their step."""
    if not workdir.best.exists():
        raise UserError(f"{workdir} kept no best checkpoint (config best_metric, set at training); give --step=N.")
    with open_manager(workdir.best, asynchronous=False) as manager:
        step = manager.latest_step()
        if step is None:
            raise UserError(f"{workdir.best} holds no checkpoint yet; it is written at the first dev evaluation.")
        params, meta = kept_params(manager, step, abstract_params, kind="best")
    log(f"best checkpoint: step {step}, {meta['metric']} {meta['value']:.4g}")
    return params, [step]


def imported_params(workdir: paths.Workdir, abstract_params) -> dict:
    """The parameters a run fine-tuning an imported model starts from (`W/imported/0`)."""
    with open_manager(workdir.imported, asynchronous=False) as manager:
        return kept_params(manager, 0, abstract_params, kind="imported")[0]


def averaged(workdir: paths.Workdir, manager, steps: list[int], abstract_params, log=print, keep: bool = True):
    """The mean parameters of `steps`: from `W/averaged/last<k>/<last step>` if averaged there
    from the same steps before, else computed (and saved there for reuse if `keep`)."""
    directory = workdir.averaged(len(steps))
    written = written_at(workdir.checkpoints, steps)
    params = saved_average(directory, steps, written, abstract_params)
    if params is not None:
        return params
    log(f"averaging the parameters of steps {steps}" + ("" if keep else " (in memory)"))
    params = average_params(manager, steps, abstract_params)
    if keep:
        with open_manager(directory, asynchronous=False) as avg:
            if steps[-1] in avg.all_steps():
                avg.delete(steps[-1])  # averaged from other checkpoints (keep_checkpoints changed)
            save_params(avg, steps[-1], params, {"checkpoint_steps": steps, "written_at": written})
    return params


def saved_average(directory, steps: list[int], written: list, abstract_params):
    """The mean parameters of `steps` saved in `directory` (`W/averaged/last<k>`), or None if
    there is none, or it was averaged from other steps or from other checkpoints of these steps
    (`written`: when each was written, `checkpoint.written_at`)."""
    if not directory.exists():
        return None
    with open_manager(directory, asynchronous=False) as avg:
        if steps[-1] not in avg.all_steps():
            return None
        params, meta = kept_params(avg, steps[-1], abstract_params)
    return params if meta["checkpoint_steps"] == steps and meta.get("written_at") == written else None
