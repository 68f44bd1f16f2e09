"""The analysis plan's statistics (experiments.stats: the pooled model, Welch for a row that fails
the variance screen, Holm's two families, TOST, the verdicts, interactions and power) against
closed forms written here with numpy alone (Student's t by integrating its density), and against
scipy where it has the same test. Hand-made numbers: a balanced design whose rows are chosen to
land in each verdict, one of them significant at 0.05 before Holm's correction and not after."""

import dataclasses
import json
import math
from pathlib import Path

import flax
import jax
import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments import __main__ as experiments_main
from experiments import rundirs
from experiments import sweep as sweep_module
from experiments.analysis import plans, records, regime, stats
from fxformer import versions

# ---------------------------------------------------------------------------------------------
# closed forms


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function: 1/2 + the integral of its density from 0 to t (Simpson)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    x = np.linspace(0.0, abs(t), 20_001)
    f = c * (1 + x * x / df) ** (-(df + 1) / 2)
    h = x[1] - x[0]
    integral = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return 0.5 + math.copysign(integral, t)


def t_two_sided(t: float, df: float) -> float:
    """P(|T| > |t|): twice the density's integral from |t| to infinity, through x = |t| / u over
    u in (0, 1] (Simpson), so that a p-value of 1e-13 keeps its relative precision."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    u = np.linspace(0.0, 1.0, 20_001)[1:]
    x = abs(t) / u
    f = np.concatenate([[0.0], c * (1 + x * x / df) ** (-(df + 1) / 2) * abs(t) / (u * u)])
    h = 1.0 / 20_000
    return 2 * h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())


def t_quantile(q: float, df: float) -> float:
    low, high = -50.0, 50.0
    for _ in range(80):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < q else (low, mid)
    return (low + high) / 2


def holm_closed_form(p: list[float]) -> list[float]:
    """Holm: sort ascending, multiply the i-th smallest (from 0) by m - i, running maximum, cap at 1."""
    order = np.argsort(p)
    m, out, running = len(p), [0.0] * len(p), 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        out[j] = running
    return out


# Log values of a balanced design: four rows beside the base, 4 seeds each, the same spread in every
# row (deviations -3, -1, +1, +3 times 0.0023: sd 0.00594, SE of a difference 0.0042), so the pooled
# residual has 5 x 3 = 15 df; 'flip' (2.2 SE) and 'unsure' (2.65 SE) sit where Holm's two families
# part them: both differences vanish under the correction, only 'flip' is inside the 2% margin.
DEVIATIONS = np.array([-3.0, -1.0, 1.0, 3.0]) * 0.0023
MEANS = {"base": 3.0, "large": 3.10, "flip": 3.00924, "same": 3.002, "unsure": 3.01113}
GROUPS = {row: list(mean + DEVIATIONS) for row, mean in MEANS.items()}
MARGIN = math.log1p(0.02)  # a 2% margin: 0.0198 on the log scale


def closed_form(groups: dict, base: str = "base", margin: float = MARGIN) -> dict:
    """The pooled model of a balanced design by hand: differences of means, SE sqrt(s_p^2 * 2 / n), df N - k."""
    n, k = len(groups[base]), len(groups)
    residual = sum(((np.array(v) - np.mean(v)) ** 2).sum() for v in groups.values())
    df = k * (n - 1)
    se = math.sqrt(residual / df * 2 / n)
    out = {}
    for row, values in groups.items():
        if row == base:
            continue
        d = float(np.mean(values) - np.mean(groups[base]))
        p = t_two_sided(d / se, df)
        p_tost = max(1 - t_cdf((d + margin) / se, df), t_cdf((d - margin) / se, df))
        half = t_quantile(0.975, df) * se
        out[row] = {"d": d, "se": se, "df": df, "p": p, "p_tost": p_tost, "ci": (d - half, d + half)}
    return out


# ---------------------------------------------------------------------------------------------
# the pooled model, the families, the verdicts


def test_the_pooled_model_equals_the_closed_form_of_a_balanced_design():
    ours, hand = stats.contrasts(GROUPS, "base"), closed_form(GROUPS)
    assert list(ours) == ["large", "flip", "same", "unsure"]
    for row, c in ours.items():
        assert c.method == "pooled" and c.n == 4 and c.df == hand[row]["df"] == 15
        assert c.estimate == pytest.approx(hand[row]["d"], abs=1e-12)
        assert c.se == pytest.approx(hand[row]["se"], rel=1e-9)
        assert c.p() == pytest.approx(hand[row]["p"], rel=1e-6)
        assert c.p_equivalent(MARGIN) == pytest.approx(hand[row]["p_tost"], rel=1e-6, abs=1e-12)
        assert c.interval() == pytest.approx(hand[row]["ci"], rel=1e-6)
        # cross-check of the closed form's t distribution with scipy's
        t = hand[row]["d"] / hand[row]["se"]
        assert hand[row]["p"] == pytest.approx(2 * scipy_stats.t.sf(abs(t), 15), rel=1e-6)
        assert hand[row]["ci"][1] - hand[row]["d"] == pytest.approx(scipy_stats.t.ppf(0.975, 15) * hand[row]["se"])
    assert hand["large"]["p"] < 1e-12  # the row whose p needs the relative tolerance


def test_the_row_and_seed_model_equals_the_two_way_closed_form_and_ignores_a_shift_per_seed():
    """Balanced (every row every seed): each row's estimate is its mean difference, the residual the
    two-way ANOVA's (y - row mean - seed mean + grand mean), (R - 1)(S - 1) df, se sqrt(2 MS / S).
    Unbalanced (base with more seeds): numpy's least squares on the same design, and a constant
    added to every value of one seed moves no estimate (it does move the unblocked model's)."""
    values = {row: dict(enumerate(v)) for row, v in GROUPS.items()}
    ours = stats.blocked(values, "base")
    y = np.array([GROUPS[row] for row in GROUPS])  # rows x seeds
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    df = (y.shape[0] - 1) * (y.shape[1] - 1)
    ms = (resid**2).sum() / df
    for i, row in enumerate(list(GROUPS)[1:], start=1):
        c = ours[row]
        assert c.method == "blocked" and c.df == df
        assert c.estimate == pytest.approx(y[i].mean() - y[0].mean(), abs=1e-12)
        assert c.se == pytest.approx(math.sqrt(2 * ms / y.shape[1]), rel=1e-9)
    rng = np.random.default_rng(0)
    uneven = {
        "base": dict(enumerate(rng.normal(0, 0.01, 9))),
        "a": {0: 0.05, 1: 0.07, 2: 0.04},
        "b": {0: -0.01, 1: 0.0, 2: 0.02},
    }
    shift = {row: {s: v + (0.3 if s == 1 else 0.0) for s, v in seeds.items()} for row, seeds in uneven.items()}
    rows, seeds = ["base", "a", "b"], list(range(9))
    design, target = [], []
    for row in rows:
        for seed, v in uneven[row].items():
            design.append([1.0, row == "a", row == "b", *(seed == k for k in seeds[1:])])
            target.append(v)
    coef, *_ = np.linalg.lstsq(np.array(design, float), np.array(target), rcond=None)
    found, shifted = stats.blocked(uneven, "base"), stats.blocked(shift, "base")
    assert [found["a"].estimate, found["b"].estimate] == pytest.approx(coef[1:3], abs=1e-12)
    assert found["a"].df == len(target) - 3 - 8
    assert [shifted[r].estimate for r in ("a", "b")] == pytest.approx([found[r].estimate for r in ("a", "b")])
    unblocked = stats.pooled({r: list(v.values()) for r, v in shift.items()}, "base")
    assert unblocked["a"].estimate != pytest.approx(
        stats.pooled({r: list(v.values()) for r, v in uneven.items()}, "base")["a"].estimate
    )


def test_holm_is_statsmodels_holm_on_families_with_ties_nan_and_ones():
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(0)
    for size in (1, 2, 5, 19):
        p = list(rng.uniform(0, 0.2, size)) + [0.01, 0.01, 1.0]  # ties and a 1
        family = {f"r{i}": float(v) for i, v in enumerate(p)}
        assert list(stats.holm(family).values()) == pytest.approx(list(multipletests(p, method="holm")[1]), abs=1e-15)
    with_nan = stats.holm({"a": 0.01, "b": float("nan"), "c": 0.02})
    assert with_nan == pytest.approx(dict(zip("abc", multipletests([0.01, 1.0, 0.02], method="holm")[1])))
    assert stats.holm({}) == {}


def test_holm_equals_the_step_down_closed_form_and_the_verdicts_cover_every_case():
    ours, hand = stats.contrasts(GROUPS, "base"), closed_form(GROUPS)
    rows = list(hand)
    raw = {row: ours[row].p() for row in rows}
    tost = {row: ours[row].p_equivalent(MARGIN) for row in rows}
    assert list(stats.holm(raw).values()) == pytest.approx(holm_closed_form([hand[r]["p"] for r in rows]), rel=1e-6)
    assert list(stats.holm(tost).values()) == pytest.approx(
        holm_closed_form([hand[r]["p_tost"] for r in rows]), rel=1e-6, abs=1e-12
    )
    adjusted, adjusted_tost = stats.holm(raw), stats.holm(tost)
    # 'flip' is a difference at 0.05 before the correction, not after it
    assert raw["flip"] < 0.05 < adjusted["flip"]
    verdicts = {}
    for row in rows:
        sign = (1 if ours[row].estimate > 0 else -1) if adjusted[row] < stats.ALPHA else 0
        verdicts[row] = stats.verdict(sign, adjusted_tost[row] < stats.ALPHA, reference=+1)
    assert verdicts == {"large": "agrees", "flip": "equivalent", "same": "equivalent", "unsure": "inconclusive"}
    # the same rows where the reference falls, and where it ties
    assert stats.verdict(+1, False, -1) == "disagrees"
    assert stats.verdict(0, True, 0) == "agrees"
    assert stats.verdict(+1, True, 0) == "agrees"  # significant but inside the margin: the tie holds
    assert stats.verdict(+1, False, 0) == "disagrees"
    assert stats.verdict(0, False, 0) == "inconclusive"


def test_two_groups_pooled_equal_scipys_student_t_test():
    base, row = [2.0, 2.1, 1.95, 2.05], [2.3, 2.2, 2.35]
    c = stats.contrasts({"base": base, "row": row}, "base")["row"]
    ref = scipy_stats.ttest_ind(row, base, equal_var=True)
    assert c.df == 5 and c.p() == pytest.approx(ref.pvalue, rel=1e-9)
    assert c.interval() == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-9)


def test_a_row_with_outlying_variance_is_tested_alone_with_welch():
    groups = {**GROUPS, "wild": [3.0, 3.3, 2.8, 3.5]}
    assert stats.variance_outliers(groups) == {"wild"}
    ours = stats.contrasts(groups, "base")
    assert ours["wild"].method == "welch" and ours["large"].method == "pooled"
    assert ours["large"].df == 15  # the pool is the other rows' alone
    row, base = np.array(groups["wild"]), np.array(groups["base"])
    a, b = row.var(ddof=1) / 4, base.var(ddof=1) / 4
    df = (a + b) ** 2 / (a * a / 3 + b * b / 3)  # Welch-Satterthwaite
    assert ours["wild"].se == pytest.approx(math.sqrt(a + b)) and ours["wild"].df == pytest.approx(df)
    assert ours["wild"].p() == pytest.approx(2 * (1 - t_cdf(abs(row.mean() - base.mean()) / math.sqrt(a + b), df)))
    assert ours["wild"].p() == pytest.approx(scipy_stats.ttest_ind(row, base, equal_var=False).pvalue, rel=1e-9)
    # the base failing the screen sends every row to Welch
    everyone = stats.contrasts({**GROUPS, "base": [3.0, 3.3, 2.8, 3.5]}, "base")
    assert {c.method for c in everyone.values()} == {"welch"}


def test_the_interaction_of_two_tables_adds_variances_with_welch_satterthwaite_df():
    first, second = stats.Contrast(0.05, 0.01, 34, 3), stats.Contrast(-0.02, 0.02, 20, 3)
    both = stats.interaction(first, second)
    assert both.estimate == pytest.approx(-0.07) and both.se == pytest.approx(math.sqrt(0.0005))
    assert both.df == pytest.approx(0.0005**2 / (1e-8 / 34 + 1.6e-7 / 20))
    low, high = both.interval()
    assert high - low == pytest.approx(2 * t_quantile(0.975, both.df) * both.se, rel=1e-6)


def test_power_is_alpha_with_no_effect_and_matches_a_simulation_of_tost():
    assert stats.power_difference(0.0, 0.01, 30, 0.05) == pytest.approx(0.05)
    assert stats.power_difference(0.05, 0.01, 30, 0.05) > 0.99
    rng = np.random.default_rng(0)
    se, margin, alpha = 0.01, math.log1p(0.05), 0.05 / 8
    estimates = rng.normal(0.0, se, 400_000)
    z = scipy_stats.norm.ppf(1 - alpha)
    simulated = np.mean((estimates - z * se > -margin) & (estimates + z * se < margin))
    assert stats.power_equivalence(margin, se, 1e7, alpha) == pytest.approx(simulated, abs=0.003)


def test_seeds_and_the_margin_rule():
    assert stats.base_seeds(3, 8) == 9 and stats.base_seeds(3, 19) == 14 and stats.base_seeds(3, 1) == 3
    # at sd 0.0133 (log dev PPL) with 3 seeds a row and 9 of base over 8 rows: 2% is out of reach, 5% is not
    assert stats.choose_margin(0.0133, 3, 9, 40, 8) == 0.05
    assert stats.choose_margin(0.002, 3, 9, 40, 8) == 0.02
    assert stats.choose_margin(0.2, 3, 9, 40, 8) is None


# ---------------------------------------------------------------------------------------------
# the plan applied to records (experiments.analysis)

RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results"
ANALYSED = sorted(p.parent for p in RESULTS.glob("**/analysis.md"))


def fake_records(groups: dict, paper: dict) -> tuple:
    """A sweep of `groups`' rows ({row: log values}) and its records: each value a seed's final dev
    PPL (exp of it) and the same value on its dev curve at step 100."""
    description = {
        "runs": {row: f"configs/table3.py:{row},smoke" for row in groups},
        "baseline": "base",
        "reference": {row: {"ppl": p} for row, p in paper.items()},
        "plan": {"readout": "final", "margin": 0.02, "readouts": ["step:100"]},
        "claims": [{"claim": "A1 is worse", "rows": {"A1": 1}}, {"claim": "E ties", "rows": {"E": 0}}],
    }
    reps = []
    for row, values in groups.items():
        for k, v in enumerate(values):
            evals, curve = {"validation": {"ppl": math.exp(v)}}, [{"step": 100, "dev_ppl": math.exp(v)}]
            reps.append({"row": row, "seed": k, "evals": evals, "curve": curve})
    doc = {"header": {"rows": list(groups), "profile": "smoke"}, "replicates": reps}
    return sweep_module.from_dict("table3", "smoke", description), doc


def test_the_analysis_of_records_is_the_closed_form_with_the_papers_directions_and_claims():
    names = dict(zip(["base", "A1", "A2", "B1", "E"], GROUPS))  # the hand-made rows under Table 3 names
    groups = {new: GROUPS[old] for new, old in names.items()}
    paper = {"base": 4.92, "A1": 5.29, "A2": 4.60, "B1": 5.16, "E": 4.92}  # A2 made better, to disagree with
    sweep, doc = fake_records(groups, paper)
    doc["replicates"].append({"row": "E", "seed": 9, "evals": {"validation": {"ppl": float("nan")}}, "curve": []})
    judged = {j.row: j for j in plans.judge(sweep, doc, plans.Plan.of(sweep))}
    plan = plans.Plan.of(sweep)
    hand = closed_form({row: groups[row] for row in groups}, margin=math.log1p(plan.margin))
    rows = ["A1", "A2", "B1", "E"]
    holm, holm_tost = (holm_closed_form([hand[r][key] for r in rows]) for key in ("p", "p_tost"))
    for i, row in enumerate(rows):
        assert judged[row].estimate == pytest.approx(hand[row]["d"], abs=1e-9)
        assert judged[row].p == pytest.approx(hand[row]["p"], rel=1e-6)
        assert judged[row].p_holm == pytest.approx(holm[i], rel=1e-6)
        assert judged[row].p_tost == pytest.approx(hand[row]["p_tost"], rel=1e-6, abs=1e-12)
        assert judged[row].p_tost_holm == pytest.approx(holm_tost[i], rel=1e-6, abs=1e-12)
    assert judged["E"].n == 4 and judged["E"].diverged == 1  # the NaN left out, and named
    assert judged["base"].paper is None and judged["E"].paper_sign == 0 and judged["A2"].paper_sign == -1
    # large -> A1 agrees (worse, as the paper); flip -> A2 equivalent (inside 2% where the paper moved);
    # same -> B1 equivalent; unsure -> E inconclusive (neither test holds where the paper ties)
    verdicts = {row: j.verdict for row, j in judged.items()}
    assert verdicts == {"base": "", "A1": "agrees", "A2": "equivalent", "B1": "equivalent", "E": "inconclusive"}
    found = plans.claims(sweep, list(judged.values()))
    assert [c["verdicts"] for c in found] == [{"A1": "agrees"}, {"E": "inconclusive"}]
    # the readout at a step reads the dev curves: the same values there, the same estimates
    at_step = plans.judge(sweep, doc, dataclasses.replace(plans.Plan.of(sweep), readout="step:100"))
    assert [j.estimate for j in at_step] == [j.estimate for j in judged.values()]


def test_the_interaction_of_two_analyses_is_the_difference_of_their_estimates():
    sweep, doc = fake_records({"base": GROUPS["base"], "A1": GROUPS["large"]}, {})
    _, other = fake_records({"base": GROUPS["base"], "A1": GROUPS["flip"]}, {})
    plan = plans.Plan.of(sweep)
    first, second = plans.judge(sweep, doc, plan), plans.judge(sweep, other, plan)
    both = plans.interactions(first, second)["A1"]
    assert both.estimate == pytest.approx(MEANS["flip"] - MEANS["large"])
    assert both.se == pytest.approx(math.sqrt(first[1].se ** 2 + second[1].se ** 2))


def test_rounded_numbers_agree_where_a_computation_differs_in_its_last_bits():
    assert 0.1 + 0.2 != 0.3 and stats.rounded(0.1 + 0.2) == stats.rounded(0.3) == 0.3
    out = stats.rounded({"x": [1, True, None, "s", math.nan, (2.0000000000001, -1e-300)], "y": {"z": 1 / 3}})
    assert out["x"][:4] == [1, True, None, "s"] and math.isnan(out["x"][4]) and out["x"][5] == [2.0, -1e-300]
    assert out["y"] == {"z": 0.3333333333}


@pytest.mark.parametrize("folder", ANALYSED, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_committed_analysis_is_what_its_records_give(folder, tmp_path):
    assert (
        experiments_main.main(
            ["collect", "table3", f"--from_records={folder / 'records.jsonl.gz'}", f"--out={tmp_path}"]
        )
        == 0
    )
    for name in ("analysis.md", "analysis.json"):
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes(), f"{folder / name}: collect it again"
    heading = (tmp_path / "analysis.md").read_text().splitlines()[0]
    assert "/" not in heading, f"the heading names a local folder: {heading}"


def test_the_records_header_names_the_datas_sha256_and_the_versions(tmp_path):
    (tmp_path / "train.en").write_bytes(b"abc")
    found = rundirs.data_files("a repository", {"data": {"source_file": str(tmp_path / "train.en"), "target_file": ""}})
    # SHA-256 of "abc" (FIPS 180-2, appendix B.1)
    assert found == {
        "source": "a repository",
        "sha256": {"train.en": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    }
    env = rundirs.environment()
    assert env["jax"] == jax.__version__ and env["flax"] == flax.__version__ and env["numpy"] == np.__version__


@pytest.mark.parametrize("folder", ["table3-regime", "table3-regime/pilot"])
def test_the_regime_records_name_their_data_and_environment(folder):
    header = records.read(str(RESULTS / folder / "records.jsonl.gz"))["header"]
    assert header["data"]["source"].startswith("https://github.com/multi30k/dataset, data/task1/raw, commit ")
    digests = header["data"]["sha256"]
    assert sorted(digests) == sorted(
        f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("en", "de")
    )
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in digests.values())
    env = header["environment"]
    assert env["platforms"] == ["cpu"] and all(env[name] for name in ("python", "jax", "jaxlib", "flax", "numpy"))


@pytest.mark.parametrize("folder", ["table3-regime", "table3-regime/pilot"])
def test_every_finished_regime_run_trained_the_one_budget_to_its_end(folder):
    """The records, not only the configs: each finished run of the regime table stopped at its
    row's budget (5,300 steps, big 15,900) at 2,048 tokens per batch, its dev curve to that step."""
    doc = records.read(str(RESULTS / folder / "records.jsonl.gz"))
    done = [rep for rep in doc["replicates"] if rep["state"] == "finished"]
    assert len(done) >= 4
    for rep in done:
        budget = 15_900 if rep["row"] == "big" else 5300
        assert rep["step"] == rep["config"]["num_train_steps"] == budget, rep["name"]
        assert rep["config"]["data"]["tokens_per_batch"] == 2048, rep["name"]
        assert max(p["step"] for p in rep["curve"] if "dev_ppl" in p) == budget, rep["name"]
        assert rep["evals"]["validation"]["checkpoint_steps"] == [budget], rep["name"]


def test_the_earlier_tables_name_their_data_and_say_the_versions_were_not_recorded():
    """The mini and 6,000-pair records were collected before headers named data and environment:
    completed afterwards, each entry says so; the 6,000-pair table read the regime table's files."""
    regime = records.read(str(RESULTS / "table3-regime" / "records.jsonl.gz"))["header"]["data"]
    headers = {
        f: records.read(str(RESULTS / f / "records.jsonl.gz"))["header"] for f in ("table3-mini", "table3-multi30k")
    }
    for header in headers.values():
        assert "after collection" in header["data"]["note"] and header["environment"]["platforms"] == ["cpu"]
        assert "not recorded" in header["environment"]["note"] and "jax" not in header["environment"]
    data = headers["table3-multi30k"]["data"]
    assert data["source"] == regime["source"] and data["sha256"] == regime["sha256"]


def test_the_cpu_is_named_with_its_widest_vector_extension():
    amd = "processor\t: 0\nmodel name\t: AMD EPYC 7B13 64-Core Processor\nflags\t\t: fpu sse4_2 avx avx2 fma\n"
    assert versions.cpu(amd) == "AMD EPYC 7B13 64-Core Processor, avx2"
    intel = amd.replace("AMD EPYC 7B13 64-Core", "Intel(R) Xeon(R)").replace("fma", "avx512f avx512bw")
    assert versions.cpu(intel) == "Intel(R) Xeon(R) Processor, avx512f"
    assert versions.cpu("model name\t: Neoverse-V2\nFeatures\t: fp asimd evtstrm\n") == "Neoverse-V2, asimd"


def test_the_full_profile_trains_every_row_for_one_budget_at_the_papers_rate_for_its_width(tmp_path):
    """The regime table's protocol (PLAN.md): the same steps and tokens per batch for every row (big
    three times the steps), no early stopping, the dev curve every 250 steps, all training pairs,
    and each row's peak learning rate d_model^-0.5 x warmup^-0.5 x scale equal to the paper's
    for its width (d_model^-0.5 x 4000^-0.5)."""
    raw = tmp_path / "task1" / "raw"
    raw.mkdir(parents=True)
    (raw / "train.en.gz").write_bytes(b"")
    rows = sweep_module.load("table3", f"multi30k-full:{tmp_path}")
    base_steps = None
    for run in rows.runs:
        config = run.resolved()
        steps = config["num_train_steps"]
        base_steps = base_steps or steps
        assert steps == (3 * base_steps if run.name == "big" else base_steps) == (15_900 if run.name == "big" else 5300)
        assert config["data"]["tokens_per_batch"] == 2048 and config["data"]["train_pairs"] == 0
        assert config["early_stopping_patience"] == 0 and config["eval_every_steps"] == 250
        d_model, warmup = config["model"]["d_model"], config["warmup_steps"]
        peak = d_model**-0.5 * warmup**-0.5 * config["learning_rate_scale"]
        assert peak == pytest.approx(d_model**-0.5 * 4000**-0.5), run.name
    # Dunnett's allocation: 9 base seeds for the 8 rows frozen first, 14 for all 19 (the amendment)
    assert stats.base_seeds(3, 8) == 9 and rows.replicates_of("base") == stats.base_seeds(3, 19) == 14
    assert rows.replicates_of("C5") == 3


def test_two_tables_side_by_side_give_each_rows_interaction_from_their_analyses(tmp_path, capsys):
    first, second = RESULTS / "table3-mini" / "records.jsonl.gz", RESULTS / "table3-multi30k" / "records.jsonl.gz"
    assert regime.main([str(first), str(second), f"--out={tmp_path}"]) == 0
    found = json.loads((tmp_path / "regime.json").read_text())
    a, b = (json.loads((p.parent / "analysis.json").read_text())["rows"] for p in (first, second))
    a, b = {r["row"]: r for r in a}, {r["row"]: r for r in b}
    for row, r in found["rows"].items():
        if r["interaction"]:
            assert r["interaction"]["estimate"] == pytest.approx(b[row]["estimate"] - a[row]["estimate"])
            assert r["interaction"]["se"] == pytest.approx(math.hypot(a[row]["se"], b[row]["se"]))
    assert "A4" in found["moved"] and "interaction [95% CI]" in (tmp_path / "regime.md").read_text()
    assert (tmp_path / "regime.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")  # the same rows, drawn


def test_the_committed_regime_comparison_is_what_the_two_records_give(tmp_path, capsys):
    folder = RESULTS / "table3-regime"
    first, second = RESULTS / "table3-multi30k" / "records.jsonl.gz", folder / "records.jsonl.gz"
    assert regime.main([str(first), str(second), f"--out={tmp_path}"]) == 0
    for name in ("regime.md", "regime.json"):
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes(), f"{folder / name}: write it again"


def test_a_row_budget_and_the_base_seeds_count_finished_runs_only():
    """Records taken mid-sweep hold running and pending replicates: a running seed's few steps and
    tokens are not the row's budget, and a pending seed is not one of base's seeds."""
    doc = records.read(str(RESULTS / "table3-multi30k" / "records.jsonl.gz"))
    done = [rep for rep in doc["replicates"] if rep["row"] == "base" and rep["state"] == "finished"]
    whole = regime.budget(doc, "base")
    partial = json.loads(json.dumps(doc))
    reps = [rep for rep in partial["replicates"] if rep["row"] == "base"]
    reps[0].update(state="running", step=50, curve=reps[0]["curve"][:1], evals={})
    reps[1].update(state="pending", step=0, curve=[], evals={}, config=None)
    rest = [rep for rep in done if rep["name"] not in (reps[0]["name"], reps[1]["name"])]
    found = regime.budget(partial, "base")
    assert found["steps"] == sorted({rep["step"] for rep in rest})
    assert found["tokens"] == pytest.approx(np.mean([rep["curve"][-1]["tokens_seen"] for rep in rest]))
    assert found["params"] == whole["params"] and found["flops"] == pytest.approx(6 * found["params"] * found["tokens"])
    table = regime.Table("t", sweep_module.of_records(doc["header"]), partial, [])
    assert regime.base_quality(table).startswith(f"{len(rest)} seeds, dev PPL ")
