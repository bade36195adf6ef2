"""A recipe study: recipes x seeds, each an ordinary run directory, then one report comparing the recipes.

    study YAML ──load_study──► StudySpec ──plan──► StudyRun (recipe, seed, run_dir, train.py overrides) ×R×S
    launch/study.py runs each unfinished one with launch/train.py (a run with a checkpoint resumes; a finished
    one is skipped), then `report`:
        per recipe: every seed's points (io.load_points) -> the hierarchical NUTS fit over seeds (one A; per-seed
        B and C_mid around recipe means) -> A, B, C_mid with intervals
        per pair: P(A_i > A_j); the compute at which their curves cross (over posterior draws: its interval, and
        how often they cross inside the plotted range); B at a common A (the paper's fixed-A comparison)
        plots: every recipe on one log-compute axis with its band; the linearised fixed-A view (slopes = B)

The YAML (configs/studies/loo_cpu.yaml is the shipped one; study files live in configs/studies/, apart from the run
configs):
    name: loo_cpu
    dir: runs/study_cpu            # the study directory (relative to the working directory)
    base: ../cpu_default.yaml      # the recipe every run starts from (relative to the YAML file)
    seeds: [0, 1]
    steps: 300                     # each run's budget: optimizer steps (the compute axis follows from them)
    overrides: [logging.progress=false]   # applied to every run
    fit: {x: generator_flops, fit_upto: 1.0, c_min: 0.0, level: 0.9}
    recipes:
      scalerl: {}                  # the base recipe itself
      loo_dapo: {ablation: ../loo_dapo.yaml}       # the keys that file sets over its own base
      lr_x2: {overrides: [optimizer.lr=2e-4]}
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
from typing import Any, Optional, Sequence

import numpy as np
import yaml

from scalerl_jax.scaling import bayes as bayes_lib
from scalerl_jax.scaling.advice import ceiling_checks
from scalerl_jax.scaling.analysis import BAYES_R0, WANDER, join_points
from scalerl_jax.scaling.compare import prob_a_greater
from scalerl_jax.scaling.curves import sigmoid_curve
from scalerl_jax.scaling.fit import fit_fixed_a
from scalerl_jax.scaling.io import DEFAULT_X, load_points
from scalerl_jax.scaling.points import CurveDataError, CurvePoints, split

STUDY_KEYS = ("name", "dir", "base", "seeds", "steps", "overrides", "fit", "recipes")
FIT_DEFAULTS = {"x": DEFAULT_X, "fit_upto": 1.0, "c_min": 0.0, "level": 0.9}


class StudyError(CurveDataError):
  """A study file or study directory that cannot be used; the message names the file and key."""


@dataclasses.dataclass(frozen=True)
class StudyRun:
  recipe: str
  seed: int
  run_dir: pathlib.Path
  overrides: tuple[str, ...]  # for launch/train.py, after --config base


@dataclasses.dataclass(frozen=True)
class StudySpec:
  name: str
  dir: pathlib.Path
  base: pathlib.Path
  seeds: tuple[int, ...]
  steps: int
  overrides: tuple[str, ...]
  fit: dict
  recipes: dict  # name -> tuple of overrides

  def plan(self) -> list[StudyRun]:
    """Every run, recipe-major (all seeds of the first recipe first)."""
    return [StudyRun(name, seed, self.dir / name / f"seed{seed}",
                     (*self.overrides, *extra, f"seed={seed}", f"pipeline.steps={self.steps}",
                      f"run_dir={self.dir / name / f'seed{seed}'}"))
            for name, extra in self.recipes.items() for seed in self.seeds]


def _flatten(prefix: str, value: Any, out: list[str]) -> None:
  if isinstance(value, dict):
    for k, v in value.items():
      _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
  else:
    out.append(f"{prefix}={value if isinstance(value, str) else json.dumps(value)}")


def ablation_overrides(path: pathlib.Path) -> list[str]:
  """The keys an ablation file sets over its own base (its `base` and `run_dir` dropped), as dotted overrides."""
  try:
    raw = yaml.safe_load(path.read_text()) or {}
  except (OSError, yaml.YAMLError) as exc:
    raise StudyError(f"{path}: cannot read the ablation ({exc})") from None
  if not isinstance(raw, dict):
    raise StudyError(f"{path}: an ablation file must be a mapping of config groups")
  out: list[str] = []
  _flatten("", {k: v for k, v in raw.items() if k not in ("base", "run_dir")}, out)
  return out


def load_study(path) -> StudySpec:
  """Reads and checks a study YAML (module docstring); errors name the file and the key."""
  path = pathlib.Path(path)
  try:
    raw = yaml.safe_load(path.read_text())
  except OSError as exc:
    raise StudyError(f"{path}: cannot read the study file ({exc.strerror or exc})") from None
  except yaml.YAMLError as exc:
    raise StudyError(f"{path}: not valid YAML ({exc})") from None
  if not isinstance(raw, dict):
    raise StudyError(f"{path}: a study file must be a mapping with keys {', '.join(STUDY_KEYS)}")
  unknown = sorted(set(raw) - set(STUDY_KEYS))
  if unknown:
    raise StudyError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(STUDY_KEYS)}")
  for key in ("name", "dir", "base", "seeds", "steps", "recipes"):
    if key not in raw:
      raise StudyError(f"{path}: `{key}` is missing")
  seeds = raw["seeds"]
  if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
    raise StudyError(f"{path}: `seeds` must be a non-empty list of integers, got {seeds!r}")
  if not isinstance(raw["steps"], int) or raw["steps"] < 1:
    raise StudyError(f"{path}: `steps` must be a positive integer, got {raw['steps']!r}")
  base = (path.parent / raw["base"]).resolve()
  if not base.is_file():
    raise StudyError(f"{path}: `base` {raw['base']!r} is not a file next to the study ({base})")
  fit = {**FIT_DEFAULTS, **(raw.get("fit") or {})}
  bad = sorted(set(fit) - set(FIT_DEFAULTS))
  if bad:
    raise StudyError(f"{path}: unknown `fit` key(s) {', '.join(bad)}; known: {', '.join(FIT_DEFAULTS)}")
  recipes = raw["recipes"]
  if not isinstance(recipes, dict) or not recipes:
    raise StudyError(f"{path}: `recipes` must map recipe names to {{ablation: FILE}} and/or {{overrides: [...]}}")
  out = {}
  for name, entry in recipes.items():
    entry = entry or {}
    if not isinstance(entry, dict) or set(entry) - {"ablation", "overrides"}:
      raise StudyError(f"{path}: recipes.{name}: use {{ablation: FILE}} and/or {{overrides: [key=value, ...]}}")
    try:
      extra = ablation_overrides(path.parent / entry["ablation"]) if "ablation" in entry else []
    except StudyError as exc:
      raise StudyError(f"{path}: recipes.{name}.ablation: {exc}") from None
    more = entry.get("overrides") or []
    if not all(isinstance(o, str) and "=" in o for o in more):
      raise StudyError(f"{path}: recipes.{name}.overrides must be key=value strings, got {more!r}")
    out[str(name)] = tuple(extra + list(more))
  overrides = raw.get("overrides") or []
  if not all(isinstance(o, str) and "=" in o for o in overrides):
    raise StudyError(f"{path}: `overrides` must be key=value strings, got {overrides!r}")
  return StudySpec(str(raw["name"]), pathlib.Path(raw["dir"]), base, tuple(seeds), int(raw["steps"]),
                   tuple(overrides), fit, out)


def check_configs(spec: StudySpec, path) -> None:
  """Every run's whole config (base, the study's overrides, the recipe's, seed and steps) loads and validates, so a
  typo in a recipe stops the study when it loads, naming the file, the run and the key, not when that run starts
  after hours of others."""
  from scalerl_jax.config import load_config
  from scalerl_jax.errors import UserError

  for run in spec.plan():
    try:
      load_config(spec.base, list(run.overrides))
    except UserError as exc:
      raise StudyError(f"{path}: run {run.recipe}/seed{run.seed}: {exc}") from None


def run_finished(run: StudyRun, steps: int) -> bool:
  """Whether the run has logged its last step's evaluation (then the study skips it)."""
  path = run.run_dir / "metrics.jsonl"
  if not path.is_file():
    return False
  for line in reversed(path.read_text().splitlines()):
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if record.get("step") == steps and "eval/pass_rate" in record:
      return True
  return False


# ---- the report ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RecipeFit:
  name: str
  points: list[CurvePoints]  # per seed (the fitted window of each)
  r0: list[float]
  post: bayes_lib.BayesFit
  inputs: list[CurvePoints] = dataclasses.field(default_factory=list)  # what was fitted per seed (R0 point too)
  fit_kw: dict = dataclasses.field(default_factory=dict)  # the fit's settings (fit_r0, samples, wander)

  def draws(self) -> dict[str, np.ndarray]:
    """The recipe-level curve's posterior draws: A, B = exp(mu_log_B), C_mid = exp(mu_log_C_mid), R0 = the mean
    over seeds (of each draw, when R0 is fitted)."""
    s = self.post.samples
    return {"A": s["A"], "B": np.exp(s["mu_log_B"]), "C_mid": np.exp(s["mu_log_C_mid"]),
            "R0": s["R0"].reshape(len(s["A"]), -1).mean(axis=1)}


def fit_recipe(name: str, points: Sequence[CurvePoints], fit: dict, *, num_warmup: int = 500,
               num_samples: int = 1000, seed: int = 0) -> RecipeFit:
  """The hierarchical fit of one recipe's seeds (one run: the one-run model, with the same draw names)."""
  windows = [split(p, fit_upto=fit["fit_upto"], c_min=fit["c_min"]) for p in points]
  pts, r0 = [w.fit for w in windows], [w.r0 for w in windows]
  free = BAYES_R0 == "free"  # as in one run's fit (analysis.BAYES_R0): each seed's R0 fitted with its C = 0 point
  data = [join_points(w.start, w.fit) for w in windows] if free else pts
  kw = dict(fit_r0=free, num_warmup=num_warmup, num_samples=num_samples, seed=seed, wander=WANDER)
  if len(pts) >= 2:
    post = bayes_lib.fit_bayes_seeds(data, r0, **kw)
  else:
    one = bayes_lib.fit_bayes(data[0], r0[0], **kw)
    samples = {**one.samples, "mu_log_B": np.log(one.samples["B"]), "mu_log_C_mid": np.log(one.samples["C_mid"])}
    post = dataclasses.replace(one, samples=samples)
  return RecipeFit(name, pts, r0, post, data, kw)


def crossover(f1: RecipeFit, f2: RecipeFit, c_lo: float, c_hi: float, level: float = 0.9, n_draws: int = 1000,
              seed: int = 0) -> dict:
  """Where the two recipes' curves cross, over paired posterior draws on a log grid in [c_lo, c_hi]: the
  fraction of draws that cross there, and the median and central `level` interval of the first crossing."""
  rng = np.random.default_rng(seed)
  d1, d2 = f1.draws(), f2.draws()
  i1 = rng.integers(0, d1["A"].size, n_draws)
  i2 = rng.integers(0, d2["A"].size, n_draws)
  grid = np.geomspace(c_lo, c_hi, 400)
  curve = lambda d, i: sigmoid_curve(grid[None, :], d["A"][i, None], d["B"][i, None], d["C_mid"][i, None],  # noqa: E731
                                     d["R0"][i, None])
  diff = curve(d1, i1) - curve(d2, i2)
  change = np.sign(diff[:, :-1]) * np.sign(diff[:, 1:]) < 0
  crossed = change.any(axis=1)
  out = {"p_cross_in_range": float(crossed.mean()), "range": [float(c_lo), float(c_hi)]}
  if crossed.any():
    first = np.argmax(change[crossed], axis=1)
    at = np.sqrt(grid[first] * grid[first + 1])
    lo, med, hi = np.quantile(at, [0.5 - level / 2, 0.5, 0.5 + level / 2])
    out.update(median=float(med), lo=float(lo), hi=float(hi))
  return out


def compare_recipes(fits: Sequence[RecipeFit], level: float = 0.9) -> list[dict]:
  """Every pair (i < j): P(A_i > A_j) and the crossover (range: the smallest fitted compute to 100x the largest)."""
  out = []
  for f1, f2 in itertools.combinations(fits, 2):
    computes = np.concatenate([p.compute for f in (f1, f2) for p in f.points])
    out.append({"recipes": [f1.name, f2.name], "p_A1_greater": prob_a_greater(f1.post, f2.post),
                "crossover": crossover(f1, f2, float(computes.min()), 100.0 * float(computes.max()), level)})
  return out


def fixed_a_comparison(fits: Sequence[RecipeFit], a: Optional[float] = None) -> dict:
  """The paper's comparison of efficiency: every recipe refitted (least squares, all seeds' points pooled) with
  A fixed to a common value (default: the mean of the recipes' median A); the higher B scales better there."""
  if a is None:
    a = float(np.mean([np.median(f.post.param("A")) for f in fits]))
  out = {"A_common": a, "B": {}, "C_mid": {}}
  for f in fits:
    c = np.concatenate([p.compute for p in f.points])  # every seed's points, equal computes too (curve_fit.x=steps)
    r = np.concatenate([p.reward for p in f.points])
    lsq = fit_fixed_a(c, r, float(np.mean(f.r0)), a)
    out["B"][f.name], out["C_mid"][f.name] = float(lsq.params.B), float(lsq.params.C_mid)
  return out


def seed_agreement(f: RecipeFit, level: float = 0.9) -> dict[str, dict]:
  """Does the one shared A describe every seed? Each seed is also fitted alone (the one-run model, the recipe's
  settings); a seed disagrees when the shared A's median lies outside the central `level` interval of its own A
  (a seed still climbing has a wide interval of its own and does not disagree)."""
  a_shared = float(np.median(f.post.param("A")))
  q = (0.5 - level / 2, 0.5, 0.5 + level / 2)
  out = {}
  for k, data in enumerate(f.inputs if len(f.inputs) > 1 else []):
    own = bayes_lib.fit_bayes(data, f.r0[k], **f.fit_kw)
    lo, med, hi = (float(v) for v in np.quantile(own.param("A"), q))
    out[f.points[k].name or f"seed{k}"] = {"A": {"median": med, "lo": lo, "hi": hi},
                                           "agrees": bool(lo <= a_shared <= hi)}
  return out


def ceiling_status(f: RecipeFit, row: dict) -> tuple[bool, str]:
  """Whether the recipe's runs identify its ceiling: `advice.ceiling_checks` on the recipe-level posterior (its
  curve bent inside the fitted computes, the interval on A below the prior's bound), and the one shared A describes every seed (`seed_misfit`
  `seed_agreement`); else why not."""
  identified, why = ceiling_checks(row["C_mid"]["median"], max(float(p.compute[-1]) for p in f.points),
                                   row["A"]["hi"])
  if not identified:
    return identified, why
  bad = {k: v["A"] for k, v in row.get("seeds_alone", {}).items() if not v["agrees"]}
  if bad:
    return False, (f"one A does not describe every seed: the shared A {row['A']['median']:.3f} lies outside " +
                   ", ".join(f"{k}'s own interval [{a['lo']:.3f}, {a['hi']:.3f}]" for k, a in bad.items()))
  return True, ""


def recipe_table(fits: Sequence[RecipeFit], level: float = 0.9) -> list[dict]:
  q = (0.5 - level / 2, 0.5, 0.5 + level / 2)
  rows = []
  for f in fits:
    d = f.draws()
    row = {"recipe": f.name, "seeds": len(f.points), "R0": float(np.mean(f.r0)), "diagnostics": f.post.diagnostics,
           "final": float(np.mean([p.reward[-1] for p in f.points])), "level": level,
           "seeds_alone": seed_agreement(f, level)}
    for k in ("A", "B", "C_mid"):
      lo, med, hi = np.quantile(d[k], q)
      row[k] = {"median": float(med), "lo": float(lo), "hi": float(hi)}
    row["ceiling_identified"], row["ceiling_why_not"] = ceiling_status(f, row)
    rows.append(row)
  return rows


def resolved(pair: dict, rows: Sequence[dict], p_min: float = 0.9) -> str:
  """Whether the study resolves which of a pair's ceilings is higher: "yes" when P(A_1 > A_2) >= p_min (or
  <= 1 - p_min: the same test on the other side, to a rounding tolerance) and both ceilings are identified, or
  when the lower recipe's ceiling is identified and its interval on A lies below the higher one's (a ceiling that
  is not identified is a lower bound at best: only the low end of its interval means anything, so it can be shown
  higher than an identified one, never lower)."""
  prob = pair["p_A1_greater"]
  if max(prob, 1.0 - prob) < p_min - 1e-9:  # one comparison for both sides (1 - 0.9 is not 0.1 in floats)
    return "no"
  r1, r2 = (next(r for r in rows if r["recipe"] == name) for name in pair["recipes"])
  high, low = (r1, r2) if prob > 0.5 else (r2, r1)
  if high["ceiling_identified"] and low["ceiling_identified"]:
    return "yes"
  if low["ceiling_identified"] and low["A"]["hi"] < high["A"]["lo"]:
    return "yes (the lower ceiling identified, intervals on A apart)"
  return "no (a ceiling not identified)"


def report(spec: StudySpec, *, num_warmup: int = 500, num_samples: int = 1000, plot: bool = True) -> dict:
  """Fits every recipe whose runs finished and writes study_report.json / .md (and plots) into the study dir."""
  fits, missing = [], {}
  for name in spec.recipes:
    runs = [r for r in spec.plan() if r.recipe == name]
    done = [r for r in runs if run_finished(r, spec.steps)]
    if len(done) < len(runs):
      missing[name] = [r.seed for r in runs if r not in done]
    if done:
      points = [load_points(r.run_dir, x=spec.fit["x"]) for r in done]
      fits.append(fit_recipe(name, [dataclasses.replace(p, name=f"{name}/seed{r.seed}") for p, r in
                                    zip(points, done)], spec.fit, num_warmup=num_warmup, num_samples=num_samples))
  if not fits:
    raise StudyError(f"{spec.dir}: no finished run to report on (run the study first)")
  level = spec.fit["level"]
  rows = recipe_table(fits, level)
  pairs = [{**pair, "resolved": resolved(pair, rows)} for pair in compare_recipes(fits, level)]
  out = {"name": spec.name, "steps": spec.steps, "seeds": list(spec.seeds), "fit": spec.fit, "level": level,
         "unfinished": missing, "recipes": rows, "pairs": pairs,
         "fixed_a": fixed_a_comparison(fits) if len(fits) > 1 else None}
  spec.dir.mkdir(parents=True, exist_ok=True)
  (spec.dir / "study_report.json").write_text(json.dumps(out, indent=1))
  (spec.dir / "study_report.md").write_text(format_report(out))
  if plot:
    from scalerl_jax.scaling import plots
    fig = plots.plot_recipes(fits, level=level, unit=spec.fit["x"])
    plots.save(fig, spec.dir / "study_curves.png")
    if len(fits) > 1:
      plots.save(plots.plot_fixed_a(fits, out["fixed_a"]), spec.dir / "study_fixed_a.png")
  return out


def _interval(v: dict, fmt: str = ".3f") -> str:
  return f"{v['median']:{fmt}} [{v['lo']:{fmt}}, {v['hi']:{fmt}}]"


def format_report(r: dict) -> str:
  """Markdown: the recipe table, the pairs, the fixed-A comparison, and which differences the runs resolve."""
  pct = round(100 * r["level"])
  lines = [f"# Study {r['name']}: {len(r['recipes'])} recipes x {len(r['seeds'])} seeds, {r['steps']} steps each",
           "", f"Posterior medians with {pct} % intervals (hierarchical over seeds: one A per recipe).", "",
           "| recipe | seeds | R0 | final (mean) | A | B | C_mid | ceiling |", "|---|---|---|---|---|---|---|---|"]
  for row in r["recipes"]:
    ceiling = "identified" if row["ceiling_identified"] else f"not identified: {row['ceiling_why_not']}"
    lines.append(f"| {row['recipe']} | {row['seeds']} | {row['R0']:.3f} | {row['final']:.3f} | {_interval(row['A'])} | "
                 f"{_interval(row['B'], '.2f')} | {_interval(row['C_mid'], '.3g')} | {ceiling} |")
  lines += ["", "| pair | P(A1 > A2) | resolved | curves cross at |", "|---|---|---|---|"]
  for p in r["pairs"]:
    prob, x = p["p_A1_greater"], p["crossover"]
    cross = (f"{x['median']:.3g} [{x['lo']:.3g}, {x['hi']:.3g}] in {100 * x['p_cross_in_range']:.0f} % of draws"
             if "median" in x else "no crossing in range")
    lines.append(f"| {p['recipes'][0]} vs {p['recipes'][1]} | {prob:.2f} | {p['resolved']} | {cross} |")
  if r.get("fixed_a"):
    fa = r["fixed_a"]
    lines += ["", f"At a common A = {fa['A_common']:.3f} (least squares, seeds pooled): B " +
              ", ".join(f"{k} {v:.2f}" for k, v in sorted(fa["B"].items(), key=lambda kv: -kv[1]))]
  if r["unfinished"]:
    lines += ["", "Unfinished runs (left out): " + "; ".join(f"{k}: seeds {v}" for k, v in r["unfinished"].items())]
  return "\n".join(lines) + "\n"
