"""Table 3 of the paper: one config per row, named by the argument `<row>[,<profile>]`.

    python -m fxformer.train --config=configs/table3.py:B1 --workdir=runs/table3/B1
    python -m fxformer.train --config=configs/table3.py:C4,mini --workdir=runs/mini/C4
    python -m experiments run table3 --root=runs/table3-mini --profile=mini   # every row

Rows: base, A1..A4, B1, B2, C1..C7, D1..D4, E, big. Blank cells are the base model's.
Table 3 reports dev (newstest2013) results with beam search and no checkpoint averaging.

Profiles:
  paper  the rows as published: WMT14, 100K steps (big: 300K).
  mini   every row's change applied to a scaled-down base on the embedded corpus, for a
         2-core CPU: widths (d_model, d_ff, d_k, d_v) x 1/8, layers x 1/2, steps 100K -> 1,000
         (big 3,000), so each row keeps its change relative to base (C4 halves d_model: 64 -> 32);
         warm-up 4% of the base run's steps as in the paper (40), and the learning rate scaled by
         sqrt(40 / 4000) so that every row peaks at the paper's rate for its width; 3,000
         training pairs seen about 25 times (big 75), in batches of 1,024 tokens. Chosen on pilot
         runs of base, D1 and C1 (docs/table3.md, "The mini profile"), then frozen.
  multi30k-full:<folder>  the paper's regime and protocol on real text: the multi30k profile's rows
         and data on all 29,000 pairs (0.69 non-embedding parameters per training target token,
         the paper's about 0.35), every row trained for the same 5,300 steps (about 20 passes;
         big 15,900) at the paper's peak learning rate for its width, no early stopping, dev
         PPL every 250 steps (experiments/results/table3-regime/PLAN.md).
  multi30k-full-lr2:<folder>  multi30k-full at twice the paper's peak learning rate for each row's
         width, the 6,000-pair table's factor: the learning-rate arm of the regime comparison
         (its PLAN.md, amendment of 2026-11-29; run for base, C5 and D2).
  multi30k:<folder>  real text (the Multi30k files under <folder>, as configs/multi30k.py
         takes them): the paper's base shape scaled as in mini (widths x 1/8, layers x 1/2,
         heads kept, the paper's dropout) with the Multi30k recipe's data, trained on its first
         6,000 pairs at twice the paper's peak learning rate for each row's width; every row
         trained to a plateau (early stopping: no dev perplexity 1% better than the last
         improvement in 3 evaluations, one every 100 steps) or the cap of 3,000 steps (big
         9,000); val is dev, test2016 the test set. Chosen on four pilots of base alone
         (experiments/results/table3-multi30k/pilot-*), then frozen.
  smoke  the same, scaled to seconds per row: for tests.
"""

import dataclasses
import math
from collections.abc import Callable

import ml_collections

from configs import base, big, multi30k
from fxformer.config import resolve_derived, with_overrides

ROWS = {
    "base": {},
    "A1": {"model.num_heads": 1, "model.d_k": 512, "model.d_v": 512},
    "A2": {"model.num_heads": 4, "model.d_k": 128, "model.d_v": 128},
    "A3": {"model.num_heads": 16, "model.d_k": 32, "model.d_v": 32},
    "A4": {"model.num_heads": 32, "model.d_k": 16, "model.d_v": 16},
    "B1": {"model.d_k": 16},
    "B2": {"model.d_k": 32},
    "C1": {"model.num_layers": 2},
    "C2": {"model.num_layers": 4},
    "C3": {"model.num_layers": 8},
    "C4": {"model.d_model": 256, "model.d_k": 32, "model.d_v": 32},
    "C5": {"model.d_model": 1024, "model.d_k": 128, "model.d_v": 128},
    "C6": {"model.d_ff": 1024},
    "C7": {"model.d_ff": 4096},
    "D1": {"model.dropout_rate": 0.0},
    "D2": {"model.dropout_rate": 0.2},
    "D3": {"label_smoothing": 0.0},
    "D4": {"label_smoothing": 0.2},
    "E": {"model.positional": "learned"},
    "big": big.OVERRIDES,
}

# The paper's published figures for each row: dev perplexity, dev BLEU, parameters x 1e6.
PAPER = {
    "base": (4.92, 25.8, 65),
    "A1": (5.29, 24.9, None),
    "A2": (5.00, 25.5, None),
    "A3": (4.91, 25.8, None),
    "A4": (5.01, 25.4, None),
    "B1": (5.16, 25.1, 58),
    "B2": (5.01, 25.4, 60),
    "C1": (6.11, 23.7, 36),
    "C2": (5.19, 25.3, 50),
    "C3": (4.88, 25.5, 80),
    "C4": (5.75, 24.5, 28),
    "C5": (4.66, 26.0, 168),
    "C6": (5.12, 25.4, 53),
    "C7": (4.75, 26.2, 90),
    "D1": (5.77, 24.6, None),
    "D2": (4.95, 25.5, None),
    "D3": (4.67, 25.3, None),
    "D4": (5.47, 25.7, None),
    "E": (4.92, 25.7, None),
    "big": (4.33, 26.4, 213),
}

# A scaled profile: the base it starts from, the factors applied to the paper's values of these
# fields in every row (so 100K base steps become `steps`, big's 300K three times that; the
# warm-up keeps its 4% share), and whether it keeps the paper's peak learning rate.
EIGHTH_SHAPE = {  # the paper's base with widths x 1/8 and layers x 1/2, heads kept: mini's and multi30k's
    "model.num_layers": 3,
    "model.d_model": 64,
    "model.d_ff": 256,
    "model.num_heads": 8,
    "model.d_k": 8,
    "model.d_v": 8,
    "model.max_len": 128,
}
MINI_BASE = {
    **EIGHTH_SHAPE,
    "data.dataset": "embedded",
    "data.num_train": 3000,  # a finite corpus seen for many epochs (about 25; big 75), as the paper's was
    "data.num_validation": 500,
    "data.vocab_size": 1000,
    "data.tokenizer_sentences": 100_000,
    "data.max_length": 64,
    "data.tokens_per_batch": 1024,  # 16 rows of 64: more updates for the same tokens on a 2-core CPU
    "checkpoint_every_steps": 100,
    "checkpoint_every_minutes": 0.0,  # saves at fixed steps only: a resumed row retraces the same steps
    "keep_checkpoints": 2,
    "log_every_steps": 25,
    "eval_every_steps": 100,  # dev perplexity along the way: the learning curves
}
SMOKE_BASE = {
    **MINI_BASE,
    "model.num_layers": 1,
    "model.d_model": 32,
    "model.d_ff": 128,
    "model.d_k": 4,
    "model.d_v": 4,
    "model.max_len": 64,
    "data.num_train": 2000,
    "data.num_validation": 40,
    "data.num_test": 40,
    "data.vocab_size": 300,
    "data.tokenizer_sentences": 4000,
    "data.max_length": 32,
    "data.tokens_per_batch": 256,
    "data.eval_batch_size": 40,
    "warmup_steps": 10,
    "checkpoint_every_steps": 4,
    "log_every_steps": 2,
    "eval_every_steps": 4,
    "decode.max_extra": 8,
}
MULTI30K_BASE = {
    **{key: value for key, value in multi30k.RECIPE.items() if key.startswith("data.")},  # dropout: the paper's
    **EIGHTH_SHAPE,
    "data.train_pairs": 6000,  # the first 6,000 pairs (pilot 4; all 29,000 did not plateau in 6,000 steps)
    "data.vocab_size": 4000,  # the output layer is most of a d_model 64 step: a smaller shared BPE
    "data.tokens_per_batch": 2048,
    "checkpoint_every_steps": 100,
    "checkpoint_every_minutes": 0.0,
    "keep_checkpoints": 2,
    "log_every_steps": 50,
    "eval_every_steps": 100,
    "dev_bleu_every_steps": 0,
    "best_metric": "dev_ppl",
    "early_stopping_patience": 3,  # the plateau: no dev perplexity 1% better than the last improvement
    "early_stopping_min_delta": 0.01,  # in 3 evaluations (pilot 4; any better value restarted the count)
}
MULTI30K_FULL_BASE = {  # the paper's regime and protocol (experiments/results/table3-regime/PLAN.md)
    **MULTI30K_BASE,
    "data.train_pairs": 0,  # all 29,000 pairs: about twice the paper's parameters per training target token
    "early_stopping_patience": 0,  # the paper's protocol: every row trained for the same budget
    "early_stopping_min_delta": 0.0,
    "checkpoint_every_steps": 250,
    "eval_every_steps": 250,  # the dev curve, from which any readout step can be computed
}
FULL_STEPS = 5300  # about 20 passes over the training target tokens at 2,048 tokens a batch (PLAN.md)
FULL_PEAK = 1.0  # every row peaks at the paper's rate for its width (PLAN.md: not piloted)
PAPER_WARMUP = 4000  # configs/base.py's warmup_steps: the peak of the paper's schedule is at this step


@dataclasses.dataclass(frozen=True)
class Profile:
    """A scaled profile: its starting fields, the factors of the SCALED fields, and whether the
    warm-up is scaled with the steps and the learning rate set to keep the paper's peak per row."""

    start: dict
    factors: dict
    paper_peak: bool = False
    files: Callable | None = None  # (config, folder) -> config reading the corpus in `folder` (profile:<folder>)
    peak: float = 1.0  # with paper_peak: every row's peak learning rate this multiple of the paper's for its width


PROFILES = {
    "paper": None,
    "mini": Profile(MINI_BASE, {"width": 1 / 8, "layers": 1 / 2, "steps": 1000 / 100_000}, paper_peak=True),
    "multi30k": Profile(  # twice the paper's peak rate for each row's width (pilot 3)
        MULTI30K_BASE, {"width": 1 / 8, "layers": 1 / 2, "steps": 3000 / 100_000}, True, multi30k.set_files, 2.0
    ),
    "multi30k-full": Profile(
        MULTI30K_FULL_BASE,
        {"width": 1 / 8, "layers": 1 / 2, "steps": FULL_STEPS / 100_000},
        True,
        multi30k.set_files,
        FULL_PEAK,
    ),  # fmt: skip
    "smoke": Profile(SMOKE_BASE, {"width": 1 / 16, "layers": 1 / 6, "steps": 8 / 100_000}),
}
PROFILES["multi30k-full-lr2"] = dataclasses.replace(PROFILES["multi30k-full"], peak=2.0)  # the learning-rate arm
SCALED = {
    "model.d_model": "width", "model.d_ff": "width", "model.d_k": "width", "model.d_v": "width",
    "model.num_layers": "layers", "num_train_steps": "steps",
}  # fmt: skip
BOOKKEEPING = ("checkpoint_every_steps", "average_last")  # the profile's own, not a row's change


def scaled(overrides: dict, factors: dict) -> dict:
    """A row's overrides in a scaled profile: scaled fields multiplied, bookkeeping dropped."""
    out = {}
    for key, value in overrides.items():
        if key in BOOKKEEPING:
            continue
        out[key] = max(1, round(value * factors[SCALED[key]])) if key in SCALED else value
    return out


def keep_paper_peak(config: ml_collections.ConfigDict, steps_factor: float, peak: float = 1.0) -> None:
    """Warm-up scaled like the steps (its 4% share of the paper's base run), and the learning rate
    scaled by sqrt(warmup / 4000): the Noam schedule d_model^-0.5 * min(step^-0.5, step *
    warmup^-1.5) then peaks at d_model^-0.5 * 4000^-0.5, the paper's peak at this row's width (so
    every row keeps the paper's ratios: C4 sqrt 2 higher than base, C5 and big sqrt 2 lower), and
    the schedule has the paper's shape in relative steps. `peak` multiplies every row's rate alike."""
    config.warmup_steps = max(1, round(PAPER_WARMUP * steps_factor))
    config.learning_rate_scale = peak * math.sqrt(config.warmup_steps / PAPER_WARMUP)


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    """The base config with Table 3 row `row` applied in `profile`; dev evaluation without averaging."""
    row, _, profile = arg.partition(",")
    profile, _, folder = (profile or "paper").partition(":")
    if row not in ROWS:
        raise ValueError(f"Unknown Table 3 row '{row}'; choose one of {', '.join(ROWS)}.")
    if profile not in PROFILES:
        raise ValueError(f"Unknown Table 3 profile '{profile}'; choose one of {', '.join(PROFILES)}.")
    chosen = PROFILES[profile]
    if folder and (chosen is None or chosen.files is None):
        raise ValueError(f"The {profile} profile reads no folder: give '{row},{profile}' without ':{folder}'.")
    if chosen is None:
        config = with_overrides(base.get_config(), ROWS[row])
    else:
        config = with_overrides(base.get_config(), chosen.start)
        config.num_train_steps = round(config.num_train_steps * chosen.factors["steps"])
        if chosen.paper_peak:
            keep_paper_peak(config, chosen.factors["steps"], chosen.peak)
        config = with_overrides(config, scaled(ROWS[row], chosen.factors))
        if folder:
            config = chosen.files(config, folder)
    config.average_last = 1
    return resolve_derived(config)  # d_k and d_v explicit in every row, as in the paper's table


# The paper's Table 3 layout: column label -> config field (a blank cell = the base row's value).
COLUMNS = {
    "N": "model.num_layers",
    "d_model": "model.d_model",
    "d_ff": "model.d_ff",
    "h": "model.num_heads",
    "d_k": "model.d_k",
    "d_v": "model.d_v",
    "P_drop": "model.dropout_rate",
    "eps_ls": "label_smoothing",
    "positions": "model.positional",
    "train steps": "num_train_steps",
}


# The mini profile was chosen on pilot runs of base, D1 and C1 (experiments/results/table3-mini/README.md)
PILOT_ROWS = {"mini": ["D1", "C1"]}

NOISE_SOURCE = (
    "per-run sd of log-perplexity 0.003 at WMT scale, Ghorbani et al. 2021, 'Scaling Laws for NMT'; "
    "per-run sd of BLEU 0.2, from a WMT en-de Transformer whose seed alone moved test BLEU by 0.26 "
    "(dmlc/gluon-nlp#1038: 0.26 / sqrt 2 = 0.18)"
)


# The paper's stated conclusions from Table 3 (section 6.2; label smoothing, section 5.4), each with
# the rows it rests on and the direction it states for their dev perplexity: +1 higher (worse),
# -1 lower (better), 0 the same (a tie). Judged by experiments/analysis/plans.py against these directions.
CLAIMS = (
    {"claim": "single-head attention is 0.9 BLEU worse than the best setting", "source": "6.2, A", "rows": {"A1": 1}},
    {"claim": "quality also drops off with too many heads", "source": "6.2, A", "rows": {"A4": 1}},
    {
        "claim": "reducing the attention key size d_k hurts model quality",
        "source": "6.2, B",
        "rows": {"B1": 1, "B2": 1},
    },  # noqa: E501
    {
        "claim": "bigger models are better",
        "source": "6.2, C",
        "rows": {"C1": 1, "C2": 1, "C4": 1, "C6": 1, "C3": -1, "C5": -1, "C7": -1, "big": -1},
    },
    {"claim": "dropout is very helpful in avoiding over-fitting", "source": "6.2, D", "rows": {"D1": 1}},
    {"claim": "label smoothing hurts perplexity", "source": "5.4", "rows": {"D3": -1, "D4": 1}},
    {"claim": "learned positional embeddings: nearly identical results", "source": "6.2, E", "rows": {"E": 0}},
)

# Seeds per row: the mini and 6,000-pair tables 5 of base, 3 a row; the full table Dunnett's
# allocation, ceil(3 sqrt k) of base for k compared rows: 9 for the 8 rows frozen first, 14 for
# all 19 (its PLAN.md's amendment, which runs base's seeds 9-13 between the new rows)
REPLICATES = {"mini": {"base": 5, "*": 3}, "multi30k": {"base": 5, "*": 3}, "multi30k-full": {"base": 14, "*": 3}}
REPLICATES["multi30k-full-lr2"] = {"*": 3}  # base, C5 and D2, 3 seeds each (the regime PLAN.md's amendment)

# The analysis plan's settings per profile (experiments/analysis/plans.py; experiments/results/table3-regime/PLAN.md)
PLANS = {
    "mini": {"readout": "final"},
    "multi30k": {"readout": "final", "readouts": ["step:700"]},  # every run reached step 700
    # the margin: frozen after the noise pilot; the readouts at 50% and 75% of the budget: its amendment (PLAN.md)
    # a row counted once its 3 seeds are finished (the amendment's stop rule)
    "multi30k-full": {
        "readout": "final",
        "margin": 0.05,
        "readouts": ["step:2500", "step:3750"],
        "complete_rows": True,
    },
    "multi30k-full-lr2": {"readout": "final", "margin": 0.05},  # the regime table's (reported without verdicts)
}
DATA_SOURCES = {
    "mini": "the embedded corpus (fxformer/data), generated from its seed",
    "multi30k": "https://github.com/multi30k/dataset, data/task1/raw, commit a3d2e0d26b56f3846f66a952536ffed4e401d05a",
}
DATA_SOURCES["multi30k-full"] = DATA_SOURCES["multi30k-full-lr2"] = DATA_SOURCES["multi30k"]


def sweep(profile: str = "paper") -> dict:
    """Table 3 as a sweep (`python -m experiments run table3`): every row, evaluated as the paper did."""
    name = profile.partition(":")[0]  # multi30k:<folder> is the multi30k profile
    return {
        "runs": {row: f"configs/table3.py:{row},{profile}" for row in ROWS},
        "baseline": "base",
        "columns": COLUMNS,
        "metrics": {"ppl": "lower", "bleu": "higher"},
        "reference": {
            row: {"ppl": ppl, "bleu": bleu, "params": params and params * 1e6}
            for row, (ppl, bleu, params) in PAPER.items()
        },
        # Seeds per row: the mini profile's table counts a direction only beyond its noise
        "replicates": REPLICATES.get(name, 1),
        # The paper's own run-to-run noise, for its ties (one run per row, no spread published)
        "noise": {"ppl": {"log_sd": 0.003}, "bleu": {"sd": 0.2}},
        "noise_source": NOISE_SOURCE,
        # dev = newstest2013 for WMT, beam 4, alpha 0.6, no checkpoint averaging
        "eval_flags": [
            "--split=validation",
            "--average_last=1",
            "--config.decode.beam_size=4",
            "--config.decode.alpha=0.6",
        ],
        # the test set too (newstest2014 for WMT), decoded the same way: beside dev in the table
        "more_splits": ["test"],
        # Rows looked at (with base) to choose the profile's recipe on the same dev set: marked in
        # the table and left out of its count (docs/table3.md, "The mini profile")
        "pilot_rows": PILOT_ROWS.get(name, []),
        "plan": PLANS.get(name, {"readout": "final"}),
        "claims": CLAIMS,
        "data_source": DATA_SOURCES.get(name, ""),
    }
