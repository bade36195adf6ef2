"""Scaling curves: the models' algebra, least-squares recovery, the R0 / window split, readers, comparisons."""

import json

import numpy as np
import pytest

from scalerl_jax import scaling
from scalerl_jax.scaling import curves, fit, io, synthetic
from scalerl_jax.scaling.curves import PowerLawParams, SigmoidParams
from scalerl_jax.scaling.points import CurveDataError, CurvePoints, split

SCALERL = synthetic.table1("ScaleRL", r0=0.30)  # C_mid 2542, B 1.92, A 0.610


# ---- models -----------------------------------------------------------------------------------------------------

def test_sigmoid_hand_values():
  p = SigmoidParams(A=0.6, B=2.0, C_mid=1000.0, R0=0.2)
  # C = 0: R0 exactly. C = C_mid: R0 + (A - R0)/2 = 0.4. C = 2 C_mid: 0.2 + 0.4 / (1 + 0.5^2) = 0.52.
  np.testing.assert_allclose(p(np.array([0.0, 1000.0, 2000.0])), [0.2, 0.4, 0.52], rtol=0, atol=1e-12)


def test_sigmoid_tends_to_its_power_law_limit():
  p = SCALERL
  c = np.array([50.0, 200.0]) * p.C_mid
  gap_sigmoid = p.A - p(c)
  gap_power = p.A - p.power_law_limit()(c)
  assert not np.allclose(gap_sigmoid, 0)
  # Relative difference of the gaps is (C_mid/C)^B to first order: < 1e-3 at 50 C_mid for B = 1.92.
  np.testing.assert_allclose(gap_sigmoid, gap_power, rtol=1e-3)


def test_linearised_form_has_slope_b_and_inverse_recovers_compute():
  p = SCALERL
  c = np.geomspace(100, 50000, 7)
  np.testing.assert_allclose(curves.log_f(p(c), p.A, p.C_mid, p.B, p.R0), p.B * np.log(c), rtol=1e-9)
  np.testing.assert_allclose(p.compute_for(p(c)), c, rtol=1e-9)
  assert np.isnan(p.compute_for(np.array([p.A + 0.01]))).all()


# ---- least squares ----------------------------------------------------------------------------------------------

def _window(params, c_max=16000.0, seed=None, fit_upto=0.5, c_min=0.0, n_evals=80):
  pts = synthetic.synthetic_run(params, c_max, n_evals=n_evals, noise=seed is not None, seed=seed or 0)
  return split(pts, fit_upto=fit_upto, c_min=c_min)


def test_paper_fitter_recovers_table1_scalerl_with_the_papers_grids():
  # Fit window as in the paper's LOO protocol: (1.5k, 8k] GPU-h of a 16k run; paper grids for A and C_mid.
  w = _window(SCALERL, c_min=1500.0)
  got = fit.fit_paper(w.fit.compute, w.fit.reward, w.r0, a_grid=fit.PAPER_A_GRID, c_mid_grid=fit.PAPER_C_MID_GRID)
  assert abs(got.params.A - 0.610) <= 0.005
  assert got.params.B == pytest.approx(1.92, rel=0.01)
  assert got.params.C_mid == pytest.approx(2542, rel=0.01)  # off the 100-point grid: the refinement found it
  coarse = fit.fit_paper(w.fit.compute, w.fit.reward, w.r0, a_grid=fit.PAPER_A_GRID,
                         c_mid_grid=fit.PAPER_C_MID_GRID, refine=False)
  assert coarse.params.C_mid in fit.PAPER_C_MID_GRID and coarse.sse > got.sse


@pytest.mark.parametrize("name", ["ScaleRL", "ScaleRL-32k", "ScaleRL-Scout", "ScaleRL-math+code-code"])
@pytest.mark.parametrize("method", ["paper", "free"])
def test_noiseless_recovery(name, method):
  truth = synthetic.table1(name, r0=0.25)
  w = _window(truth, c_max=10 * truth.C_mid, fit_upto=0.5)
  f = fit.fit_paper if method == "paper" else fit.fit_free
  got = f(w.fit.compute, w.fit.reward, w.r0).params
  assert got.A == pytest.approx(truth.A, abs=1e-3)
  assert got.B == pytest.approx(truth.B, rel=0.01)
  assert got.C_mid == pytest.approx(truth.C_mid, rel=0.01)


@pytest.mark.parametrize("method", ["paper", "free"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noisy_recovery_binomial_noise(method, seed):
  # 1000 prompts x 16 samples: the pass rate's noise sd is about 0.004.
  w = _window(SCALERL, seed=seed, fit_upto=1.0)
  f = fit.fit_paper if method == "paper" else fit.fit_free
  got = f(w.fit.compute, w.fit.reward, w.r0)
  assert abs(got.params.A - SCALERL.A) <= 0.01
  assert got.params.B == pytest.approx(SCALERL.B, rel=0.1)
  assert got.params.C_mid == pytest.approx(SCALERL.C_mid, rel=0.1)
  assert got.rmse == pytest.approx(np.sqrt(0.6 * 0.4 / 16000), rel=0.3)  # residuals are the noise


def test_delta_band_covers_the_truth_and_grows_with_extrapolation():
  w = _window(SCALERL, seed=4)
  got = fit.fit_free(w.fit.compute, w.fit.reward, w.r0)
  c = np.array([4000.0, 16000.0, 64000.0])
  lo, hi = got.band(c)
  assert np.all(lo < got.params(c)) and np.all(hi > got.params(c))
  assert np.all(np.diff(hi - lo) > 0)  # wider further out
  assert lo[1] <= SCALERL(16000.0) <= hi[1]
  plo, phi = got.band(c, predictive=True)  # adds the residual variance (~0.004^2) of one new measurement
  z = 1.6448536  # standard normal 95th percentile
  np.testing.assert_allclose((phi - plo) ** 2 - (hi - lo) ** 2, (2 * z) ** 2 * got.sse / (got.n - 3), rtol=1e-6)


def test_free_fit_can_fit_r0_from_the_zero_compute_point():
  truth = SigmoidParams(0.65, 1.5, 3000.0, 0.22)
  pts = synthetic.synthetic_run(truth, 20000.0, noise=False)
  got = fit.fit_free(pts.compute, pts.reward, r0=0.4, fit_r0=True)  # start value far off
  assert got.params.R0 == pytest.approx(0.22, abs=1e-4)
  assert got.cov.shape == (4, 4)


def test_fixed_a_fit_holds_a():
  w = _window(SCALERL, seed=5)
  got = fit.fit_fixed_a(w.fit.compute, w.fit.reward, w.r0, 0.63)
  assert got.params.A == 0.63 and got.method == "fixed_a"
  free = fit.fit_free(w.fit.compute, w.fit.reward, w.r0)
  assert got.sse >= free.sse  # a constrained fit cannot beat the free one


def test_power_law_recovers_its_own_parameters_and_misses_the_sigmoid_ceiling():
  truth = PowerLawParams(A=0.7, D=30.0, B=0.6)
  c = np.geomspace(100, 20000, 40)
  got = fit.fit_power_law(c, truth(c)).params
  assert (got.A, got.D, got.B) == pytest.approx((0.7, 30.0, 0.6), rel=1e-4)
  noisy = truth(c) + np.random.default_rng(0).normal(0, 0.004, c.size)
  assert fit.fit_power_law(c, noisy).params.A == pytest.approx(0.7, abs=0.02)
  # Paper A.4: fitted on a sigmoid's early and middle part, the power law overshoots the ceiling.
  w = _window(SCALERL)
  early = fit.fit_power_law(w.fit.compute, w.fit.reward).params
  assert early.A > SCALERL.A + 0.1


def test_too_few_points_is_an_error():
  with pytest.raises(CurveDataError, match="need >= 4"):
    fit.fit_paper([1.0, 2.0, 3.0], [0.3, 0.4, 0.5], 0.2)


# ---- points and the split -----------------------------------------------------------------------------------------

def test_split_takes_r0_from_first_point_and_applies_c_min_and_fit_upto():
  pts = CurvePoints([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [0.25] + [0.3] * 10)
  w = split(pts, fit_upto=0.5, c_min=2)
  assert w.r0 == 0.25 and len(w.start) == 1
  assert w.fit.compute.tolist() == [2, 3, 4, 5] and w.held_out.compute.tolist() == [6, 7, 8, 9, 10]
  w = split(pts, fit_upto=1.0, r0=0.1)  # explicit R0: every C > 0 point is a curve point
  assert w.r0 == 0.1 and len(w.fit) == 10
  with pytest.raises(CurveDataError, match=r"only 3 usable point\(s\)"):
    split(pts, fit_upto=0.5, c_min=3)


@pytest.mark.parametrize("compute,reward,match", [
    ([0, 1, 1, 2], [0.1, 0.2, 0.3, 0.4], "increase strictly"),
    ([0, 2, 1, 3], [0.1, 0.2, 0.3, 0.4], "increase strictly"),
    ([0, 1, 2, 3], [0.1, np.nan, 0.3, 0.4], "NaN"),
    ([0, 1, 2, 3], [0.1, 0.2, 1.3, 0.4], r"\[0, 1\]"),
])
def test_points_validation(compute, reward, match):
  with pytest.raises(CurveDataError, match=match):
    CurvePoints(compute, reward)


def test_counts_validation():
  with pytest.raises(CurveDataError, match="n_correct <= n_total"):
    CurvePoints([0, 1], [0.1, 0.2], n_correct=[1, 5], n_total=[10, 4])


# ---- readers ----------------------------------------------------------------------------------------------------

def test_metrics_jsonl_round_trip_on_every_axis(tmp_path):
  pts = synthetic.synthetic_run(SCALERL, 100.0, n_evals=6, n_prompts=20, samples_per_prompt=4, prompt_phi=5.0)
  synthetic.write_run_dir(pts, tmp_path / "run", flops_per_hour=2e15)
  hours = io.load_points(tmp_path / "run", x="accelerator_hours")
  np.testing.assert_allclose(hours.compute, pts.compute)
  np.testing.assert_array_equal(hours.n_correct, pts.n_correct)
  np.testing.assert_array_equal(hours.per_prompt, pts.per_prompt)
  assert hours.samples_per_prompt == 4
  np.testing.assert_allclose(io.load_points(tmp_path / "run", x="accelerator_seconds").compute, pts.compute * 3600)
  np.testing.assert_allclose(io.load_points(tmp_path / "run" / "metrics.jsonl", x="flops").compute, pts.compute * 2e15)


def test_csv_with_counts(tmp_path):
  path = tmp_path / "r.csv"
  path.write_text("compute,reward,n_correct,n_total\n0,0.25,4,16\n1,0.5,8,16\n")
  pts = io.load_points(path)
  assert pts.compute.tolist() == [0, 1] and pts.n_correct.tolist() == [4, 8]
  path.write_text("compute,reward\n0,0.25\n1,oops\n")
  with pytest.raises(CurveDataError, match=r"r.csv:3: column reward is not a number"):
    io.load_points(path)


def test_tensorboard_events(tmp_path):
  tbx = pytest.importorskip("tensorboardX")
  writer = tbx.SummaryWriter(str(tmp_path / "tb"))
  for step, (c, r) in enumerate([(0.0, 0.2), (3600.0, 0.3), (7200.0, 0.35)]):
    writer.add_scalar("compute/accelerator_seconds", c, step * 100)
    writer.add_scalar("eval/pass_rate", r, step * 100)
  writer.add_scalar("compute/accelerator_seconds", 9000.0, 250)  # a train step without an eval
  writer.close()
  pts = io.load_points(tmp_path / "tb", x="accelerator_hours")
  np.testing.assert_allclose(pts.compute, [0.0, 1.0, 2.0])
  np.testing.assert_allclose(pts.reward, [0.2, 0.3, 0.35], rtol=1e-6)


def test_unreadable_inputs(tmp_path):
  (tmp_path / "metrics.jsonl").write_text('{"step": 0}\nnot json\n')
  with pytest.raises(CurveDataError, match="metrics.jsonl:2: not a JSON line"):
    io.load_points(tmp_path)
  with pytest.raises(CurveDataError, match="no such file"):
    io.load_points(tmp_path / "missing.csv")
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(CurveDataError, match="no metrics.jsonl"):
    io.load_points(empty)


# ---- comparisons and the end-to-end summary -----------------------------------------------------------------------

def test_crossings_are_where_the_curves_meet():
  fast = SigmoidParams(A=0.585, B=2.44, C_mid=2000.0, R0=0.3)  # efficient, lower ceiling
  slow = SigmoidParams(A=0.645, B=1.7, C_mid=4000.0, R0=0.3)
  got = scaling.crossings(fast, slow, 10.0, 1e6)
  # The steeper curve starts lower (larger B), overtakes, and is overtaken again by the higher ceiling.
  assert len(got) == 2 and got[0] < fast.C_mid < got[1]
  for c in got:
    assert fast(c) == pytest.approx(slow(c), abs=1e-9)
  assert fast(got[0] / 2) < slow(got[0] / 2)
  assert fast(np.sqrt(got[0] * got[1])) > slow(np.sqrt(got[0] * got[1]))
  assert fast(2 * got[1]) < slow(2 * got[1])
  assert scaling.crossings(fast, slow, 1000.0, 1e6) == pytest.approx([got[1]])


def test_b_rule_compares_b_only_at_a_common_a():
  def run(a, b, seed):
    return scaling.analyse(synthetic.synthetic_run(SigmoidParams(a, b, 2500.0, 0.3), 20000.0, seed=seed),
                           fit_upto=1.0)
  steep, shallow, higher = run(0.61, 2.3, 1), run(0.61, 1.4, 2), run(0.66, 1.4, 3)
  rule = scaling.compare_b(steep, shallow)
  assert rule["comparable"] and rule["higher_B"] == 0 and rule["B"][0] > rule["B"][1]
  assert rule["A_common"] == pytest.approx((steep.lsq.params.A + shallow.lsq.params.A) / 2)
  assert not scaling.compare_b(steep, higher)["comparable"]


def test_fit_run_summary_is_json_ready(tmp_path):
  pts = synthetic.synthetic_run(SCALERL, 16000.0, seed=7, name="scalerl")
  s = scaling.fit_run(pts, bayes=False, plot=str(tmp_path / "fit.png"))
  json.dumps(s, allow_nan=False)
  assert (tmp_path / "fit.png").stat().st_size > 0
  assert s["n_fit"] == 40 and s["n_held_out"] == 40
  assert abs(s["A"] - SCALERL.A) <= 0.02
  e = s["extrapolation"]
  assert e["c_last"] == 16000.0 and abs(e["predicted"] - SCALERL(16000.0)) <= 0.02
  assert e["band"][0] < e["predicted"] < e["band"][1]
  assert "A=" in scaling.format_report(s) and "measured" in scaling.format_report(s)


@pytest.mark.parametrize("x, label", [("accelerator_hours", "compute (accelerator-hours)"),
                                      ("accelerator_seconds", "compute (accelerator-seconds)"),
                                      ("flops", "compute (FLOPs)")])
def test_plots_name_the_compute_unit_the_points_were_read_on(tmp_path, x, label):
  plots = pytest.importorskip("scalerl_jax.scaling.plots")
  synthetic.write_run_dir(synthetic.synthetic_run(SCALERL, 16000.0, seed=3, name="a"), tmp_path / "run")
  run = scaling.analyse(io.load_points(tmp_path / "run", x=x))
  assert run.points.x_axis == x and run.window.fit.x_axis == x  # the split keeps the unit
  assert plots.plot_fit(run).get_xlabel() == label
  assert plots.plot_comparison([run, run]).get_xlabel() == label
  unknown = scaling.analyse(synthetic.synthetic_run(SCALERL, 16000.0, seed=3))  # no unit recorded: none claimed
  assert plots.plot_fit(unknown).get_xlabel() == "compute"
  assert plots.plot_comparison([run, unknown]).get_xlabel() == "compute"
  plots.plt.close("all")


def test_scaling_modules_do_not_import_each_other_in_a_cycle():
  """Layers, lazy imports included: points -> io / fit / bayes -> analysis -> compare -> plots -> end_of_run."""
  import ast
  import pathlib
  folder = pathlib.Path(scaling.__file__).parent
  modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
  deps = {}
  for name in modules:
    found = set()
    for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
      if isinstance(node, ast.ImportFrom) and node.module == "scalerl_jax.scaling":
        found |= {a.name for a in node.names}
      elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scalerl_jax.scaling."):
        found.add(node.module.split(".")[2])
      elif isinstance(node, ast.Import):
        found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("scalerl_jax.scaling.")}
    deps[name] = found & modules

  def reachable(start):
    seen, todo = set(), list(deps[start])
    while todo:
      m = todo.pop()
      if m not in seen:
        seen.add(m)
        todo.extend(deps[m])
    return seen

  assert deps["end_of_run"] >= {"analysis"} and "plots" in deps["end_of_run"]
  assert [m for m in sorted(modules) if m in reachable(m)] == []
