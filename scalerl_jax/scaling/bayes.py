"""Bayesian fit of R(C) = R0 + (A - R0) * sigmoid(B (ln C - ln C_mid)) with NumPyro's NUTS.

Priors (departing from the paper, which only reports least-squares point estimates):
    A          = R0 + (a_max - R0) * u,   u ~ Uniform(0, 1)       (A between R0 and 1, or a pass@k bound a_max)
    ln B       ~ Normal(ln 1.5, 0.5)                               (Table 1: B in 1.09..2.44)
    ln C_mid   ~ Normal(m, s),  m = mid-point of ln C over the fitted points, s = max(1.5, that ln-range)
    or, for ln B and ln C_mid, a prior learned from finished runs (prior.CurvePrior, `fit_bayes(prior=...)`)
    R0         fixed to the measured start (default), or ~ Uniform(0, 1) with fit_r0 (then C = 0 points inform it)
Likelihoods, per evaluation point i with mean mu_i = R(C_i):
    gaussian      reward_i ~ Normal(mu_i, sigma),            sigma ~ HalfNormal(0.05)
    binomial      n_correct_i ~ Binomial(n_total_i, mu_i)    (needs the counts)
    betabinomial  per-prompt k_ij ~ BetaBinomial(mu_i phi, (1 - mu_i) phi, n),  phi ~ LogNormal(ln 10, 1.5)
                  (prompt difficulty spread; needs per-prompt counts; evaluated on the histogram of k_ij)
    auto          betabinomial if per-prompt counts exist, else binomial if totals exist, else gaussian.
Hierarchical over seeds (`fit_bayes_seeds`): one A shared by all seeds (A ~ Uniform(max_k R0_k, 1); with fit_r0
each R0_k ~ Uniform(0, 1) and its C = 0 point is data); per seed
ln B_k ~ Normal(mu_B, tau_B) and ln C_mid_k ~ Normal(mu_M, tau_M), non-centred, tau_B ~ HalfNormal(0.3),
tau_M ~ HalfNormal(0.5), mu_B and mu_M with the priors above.

Sampling: one chain per call of a jitted NUTS scan (`_nuts_chain`); points are padded to a multiple of 16
(masked) so that runs of similar length share one compiled program. Chains (num_chains > 1) run one after the other.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer.hmc import hmc
from numpyro.infer.util import initialize_model
from scipy.special import expit, gammaln

from scalerl_jax.scaling.curves import Discrepancy, logit, sigmoid_curve
from scalerl_jax.scaling.points import MIN_FIT_POINTS, CurveDataError, CurvePoints
from scalerl_jax.scaling.prior import CurvePrior

LIKELIHOODS = ("auto", "gaussian", "binomial", "betabinomial")
WANDERS = ("none", "iid", "ou")
LOG_B_PRIOR = (np.log(1.5), 0.5)
PAD = 16


def _mean_curve(log_c, pos, a, b, log_c_mid, r0):
  """R(C) in jnp; pos marks C > 0 (C = 0 gives R0 with finite gradients)."""
  s = jnp.where(pos, jax.nn.sigmoid(b * (jnp.where(pos, log_c, 0.0) - log_c_mid)), 0.0)
  return r0 + (a - r0) * s


def _ou_path(z, x, s, ell):
  """An Ornstein-Uhlenbeck path at positions x [..., N] (non-decreasing) from standard normals z [..., N]:
  f_0 = s z_0, f_i = rho_i f_(i-1) + s sqrt(1 - rho_i^2) z_i with rho_i = exp(-(x_i - x_(i-1)) / ell), i.e. the
  stationary Gaussian process with covariance s^2 exp(-|x - x'| / ell) (Matern 1/2), sampled non-centred. Padding
  repeats the last x, so a padded point copies the one before it (rho = 1)."""
  dx = jnp.diff(x, axis=-1)
  rho = jnp.exp(-dx / ell)
  innov = s * jnp.sqrt(jnp.maximum(-jnp.expm1(-2.0 * dx / ell), 1e-12)) * z[..., 1:]

  def step(f, inp):
    f = inp[0] * f + inp[1]
    return f, f

  f0 = s * z[..., 0]
  _, rest = jax.lax.scan(step, f0, (jnp.moveaxis(rho, -1, 0), jnp.moveaxis(innov, -1, 0)))
  return jnp.concatenate([f0[..., None], jnp.moveaxis(rest, 0, -1)], axis=-1)


def _observe(mu, d, likelihood: str, wander: str = "none"):
  """The likelihood of the points; mu and the data arrays are [N] (or [K, N] over seeds), padding masked out.
  `wander` (WANDERS): a run's own fluctuation off the smooth curve, beyond the evaluation's sampling noise, on the
  logit scale, logit(p_i) = logit(mu_i) + f_i:
      iid  f_i = s z_i                        independent per evaluation, s ~ HalfNormal(0.3)
      ou   f = an Ornstein-Uhlenbeck path over compute (`_ou_path`): successive evaluations of one policy are
           correlated, s ~ HalfNormal(0.3), its correlation length ell ~ LogNormal(ln 0.2, 1) in units of the
           fitted compute range (x = C / the last fitted C)."""
  mu = jnp.clip(mu, 1e-6, 1 - 1e-6)
  if wander != "none":
    s = numpyro.sample("wander_sigma", dist.HalfNormal(0.3))
    z = numpyro.sample("wander_z", dist.Normal(0.0, 1.0).expand(mu.shape).to_event(mu.ndim))
    if wander == "ou":
      ell = numpyro.sample("wander_ell", dist.LogNormal(np.log(0.2), 1.0))
      f = numpyro.deterministic("wander_f", _ou_path(z, d["x"], s, ell))
    else:
      f = numpyro.deterministic("wander_f", s * z)
    mu = jnp.clip(jax.nn.sigmoid(jax.scipy.special.logit(mu) + f), 1e-6, 1 - 1e-6)
  if likelihood == "gaussian":
    sigma = numpyro.sample("sigma", dist.HalfNormal(0.05))
    numpyro.sample("obs", dist.Normal(mu, sigma).mask(d["valid"]), obs=d["reward"])
  elif likelihood == "binomial":
    numpyro.sample("obs", dist.Binomial(d["n_total"], probs=mu).mask(d["valid"]), obs=d["n_correct"])
  else:
    # Sufficient statistic: hist[..., i, k] = number of prompts with k correct samples at evaluation i, so the
    # cost is [N, n + 1] log-probabilities instead of [N, P].
    phi = numpyro.sample("phi", dist.LogNormal(np.log(10.0), 1.5))
    hist = d["hist"]
    log_p = betabinomial_logpmf(mu * phi, (1 - mu) * phi, hist.shape[-1] - 1)
    numpyro.factor("obs", jnp.sum(jnp.where(d["valid"][..., None], hist * log_p, 0.0)))


def betabinomial_logpmf(alpha, beta, n: int):
  """log BetaBinomial(k | n, alpha, beta) for k = 0..n, shape [..., n + 1], with rising factorials
  R(x, k) = sum_{j<k} ln(x + j) instead of lgamma (cheaper to differentiate, n is small):
      ln p(k) = ln C(n, k) + R(alpha, k) + R(beta, n - k) - R(alpha + beta, n)."""
  j = jnp.arange(n, dtype=jnp.float32)
  zero = jnp.zeros(jnp.shape(alpha) + (1,), jnp.float32)
  rise_a = jnp.concatenate([zero, jnp.cumsum(jnp.log(alpha[..., None] + j), -1)], -1)  # R(alpha, k), k = 0..n
  rise_b = jnp.concatenate([zero, jnp.cumsum(jnp.log(beta[..., None] + j), -1)], -1)
  rise_ab = jnp.sum(jnp.log((alpha + beta)[..., None] + j), -1, keepdims=True)
  k = np.arange(n + 1)
  log_choose = gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)
  return log_choose + rise_a + rise_b[..., ::-1] - rise_ab


def sigmoid_model(d: Dict[str, jnp.ndarray], likelihood: str, fit_r0: bool, wander: str = "none"):
  """One run (module docstring)."""
  r0 = numpyro.sample("R0", dist.Uniform(0.0, 1.0)) if fit_r0 else numpyro.deterministic("R0", d["r0"])
  u = numpyro.sample("u", dist.Uniform(0.0, 1.0))
  a = numpyro.deterministic("A", r0 + (jnp.maximum(d["a_max"], r0) - r0) * u)  # a_max: 1, or a pass@k bound
  log_b = numpyro.sample("log_B", dist.Normal(d["b_loc"], d["b_scale"]))
  log_m = numpyro.sample("log_C_mid", dist.Normal(d["loc"], d["scale"]))
  numpyro.deterministic("B", jnp.exp(log_b))
  numpyro.deterministic("C_mid", jnp.exp(log_m))
  _observe(_mean_curve(d["log_c"], d["pos"], a, jnp.exp(log_b), log_m, r0), d, likelihood, wander)


def seeds_model(d: Dict[str, jnp.ndarray], likelihood: str, fit_r0: bool, wander: str = "none"):
  """K seeds sharing A; data arrays carry a leading seed axis [K, N] (module docstring)."""
  k = d["r0"].shape[0]
  if fit_r0:  # one R0 per seed, its C = 0 evaluation among the data; A above the highest
    with numpyro.plate("seed_r0", k):
      r0 = numpyro.sample("R0", dist.Uniform(0.0, 1.0))
    top = jnp.max(r0)
    a = numpyro.deterministic("A", top + (1 - top) * numpyro.sample("u", dist.Uniform(0.0, 1.0)))
  else:
    r0 = d["r0"]
    a = numpyro.sample("A", dist.Uniform(jnp.max(r0), 1.0))
  mu_b = numpyro.sample("mu_log_B", dist.Normal(*LOG_B_PRIOR))
  tau_b = numpyro.sample("tau_log_B", dist.HalfNormal(0.3))
  mu_m = numpyro.sample("mu_log_C_mid", dist.Normal(d["loc"], d["scale"]))
  tau_m = numpyro.sample("tau_log_C_mid", dist.HalfNormal(0.5))
  with numpyro.plate("seed", k):
    log_b = mu_b + tau_b * numpyro.sample("z_B", dist.Normal(0.0, 1.0))
    log_m = mu_m + tau_m * numpyro.sample("z_C_mid", dist.Normal(0.0, 1.0))
  if not fit_r0:
    numpyro.deterministic("R0", r0)
  numpyro.deterministic("B", jnp.exp(log_b))
  numpyro.deterministic("C_mid", jnp.exp(log_m))
  mu = _mean_curve(d["log_c"], d["pos"], a, jnp.exp(log_b)[:, None], log_m[:, None], r0[:, None])
  _observe(mu, d, likelihood, wander)


@dataclasses.dataclass(frozen=True)
class BayesFit:
  """Posterior samples of a sigmoid fit. A, R0: [S]; B, C_mid: [S] (one run) or [S, K] (K seeds)."""
  samples: Dict[str, np.ndarray]
  likelihood: str
  n_total: float  # samples per evaluation (median over the fitted points), for predictive noise
  n_prompts: int  # held-out prompts (betabinomial predictive); 0 if unknown
  diagnostics: Dict[str, float]
  wander: str = "none"  # WANDERS
  fit_x: Tuple[np.ndarray, ...] = ()  # per run, the fitted points' compute / x_scale (the OU wander's positions)
  x_scale: float = 1.0
  discrepancy: Discrepancy = Discrepancy()  # the predictive band's model discrepancy beyond the fit

  def param(self, name: str, seed: Optional[int] = None) -> np.ndarray:
    v = self.samples[name]
    return v[:, seed] if (seed is not None and v.ndim == 2) else v

  def quantiles(self, name: str, q: Sequence[float] = (0.05, 0.5, 0.95), seed: Optional[int] = None) -> Dict:
    vals = np.quantile(self.param(name, seed), q)
    return {f"q{round(100 * p):02d}": float(v) for p, v in zip(q, vals)}

  def curves(self, c, seed: Optional[int] = None) -> np.ndarray:
    """Posterior mean curves R(c) per sample: [S, len(c)]."""
    g = lambda n: self.param(n, seed)[:, None]  # noqa: E731
    return sigmoid_curve(np.asarray(c, dtype=float)[None, :], g("A"), g("B"), g("C_mid"), g("R0"))

  def wander_draws(self, c, seed: Optional[int] = None, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Draws of the wander f(c) on the logit scale, [S, len(c)] (see `_observe`). For the OU wander, each c is
    conditioned on the nearest fitted point's f (exact beyond the data, where that point is the last one; between
    two fitted points it ignores the farther one, so the band there is a little wide)."""
    rng = rng or np.random.default_rng(0)
    c = np.asarray(c, dtype=float)
    s = self.samples["wander_sigma"][:, None]
    eps = rng.normal(size=(len(s), 1))  # one draw per sample for every c: the band is smooth in c
    if self.wander == "iid":
      return s * eps
    f = self.samples["wander_f"]
    k = seed if seed is not None else 0
    fx = self.fit_x[k]
    f = (f[:, k] if f.ndim == 3 else f)[:, :fx.size]
    x = c / self.x_scale
    j = np.argmin(np.abs(x[:, None] - fx[None, :]), axis=1)
    rho = np.exp(-np.abs(x - fx[j])[None, :] / self.samples["wander_ell"][:, None])
    return rho * f[:, j] + s * np.sqrt(1.0 - rho**2) * eps

  def band(self, c, level: float = 0.9, predictive: bool = False, seed: Optional[int] = None,
           rng: Optional[np.random.Generator] = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower, median, upper) of R(c) at central `level`. `predictive` adds what a measurement at c carries
    beyond the mean curve: the wander (`wander_draws`) and the model discrepancy beyond the fit
    (curves.Discrepancy), both on the logit scale, then the likelihood's noise for one evaluation of n_total
    samples (binomial and betabinomial: their normal approximations, the latter with the phi overdispersion
    factor). Each random term is drawn once per posterior sample for every c, so the band is smooth in c."""
    mu = self.curves(c, seed)
    if predictive:
      rng = rng or np.random.default_rng(0)
      # On the logit scale: the run's own wander off the curve and the model's discrepancy beyond the fit; then
      # the evaluation's sampling noise.
      c = np.asarray(c, dtype=float)
      off = np.zeros(mu.shape)
      if self.wander != "none":
        off = off + self.wander_draws(c, seed, rng)
      c_fit_last = float(self.fit_x[seed or 0][-1]) * self.x_scale if self.fit_x else 0.0
      sd = self.discrepancy.sd(c, c_fit_last)
      # every random term draws once per posterior sample and serves every c, so the band is smooth in c
      one = (mu.shape[0], 1)
      if np.any(sd > 0):
        off = off + self.discrepancy.draws(rng, one) * sd[None, :]
      if np.any(off != 0):
        mu = expit(logit(mu) + off)
      if self.likelihood == "gaussian":
        mu = mu + rng.normal(size=one) * self.samples["sigma"][:, None]
      elif self.likelihood == "binomial":  # its normal approximation: continuous in c
        mu = mu + rng.normal(size=one) * np.sqrt(np.clip(mu * (1 - mu), 0, None) / max(self.n_total, 1.0))
      else:
        spp = self.n_total / max(self.n_prompts, 1)
        var = mu * (1 - mu) / self.n_total * (1 + (spp - 1) / (self.samples["phi"][:, None] + 1))
        mu = mu + rng.normal(size=one) * np.sqrt(var)
    lo, med, hi = np.quantile(mu, [0.5 - level / 2, 0.5, 0.5 + level / 2], axis=0)
    if predictive and self.discrepancy.scores and np.any(sd > 0):
      # conformal beyond the cut-off, ramping in from the draws' own band (curves.Discrepancy.ramp)
      lo90, hi90 = np.quantile(mu, [0.05, 0.95], axis=0)
      clo, chi = self.discrepancy.conformal(lo90, med, hi90, level)
      w = self.discrepancy.ramp(self.discrepancy.distance(c, c_fit_last))
      lo, hi = (1 - w) * lo + w * clo, (1 - w) * hi + w * chi
    return lo, med, hi


def _resolve(likelihood: str, pts: Sequence[CurvePoints]) -> str:
  if likelihood not in LIKELIHOODS:
    raise CurveDataError(f"unknown likelihood {likelihood!r}; choose one of {LIKELIHOODS}")
  if likelihood == "auto":
    likelihood = ("betabinomial" if all(p.per_prompt is not None for p in pts)
                  else "binomial" if all(p.has_counts for p in pts) else "gaussian")
  has = {"binomial": lambda p: p.has_counts, "betabinomial": lambda p: p.per_prompt is not None}.get(likelihood)
  if has and not all(has(p) for p in pts):
    what = "n_correct/n_total" if likelihood == "binomial" else "per-prompt counts"
    raise CurveDataError(f"likelihood {likelihood!r} needs {what} in every input")
  return likelihood


def _arrays(p: CurvePoints, n_pad: int, likelihood: str) -> Dict[str, np.ndarray]:
  n = len(p)
  pad = lambda v, fill=0: np.concatenate([v, np.full((n_pad - n,) + v.shape[1:], fill, v.dtype)])  # noqa: E731
  pos = p.compute > 0
  d = {"log_c": pad(np.log(np.where(pos, p.compute, 1.0)).astype(np.float32)), "pos": pad(pos, False),
       "c": pad(p.compute, p.compute[-1]),
       "valid": pad(np.ones(n, bool), False), "reward": pad(p.reward.astype(np.float32), 0.5)}
  if likelihood == "binomial":
    d.update(n_correct=pad(p.n_correct.astype(np.float32)), n_total=pad(p.n_total.astype(np.float32), 1))
  if likelihood == "betabinomial":
    hist = np.stack([np.bincount(row, minlength=p.samples_per_prompt + 1) for row in p.per_prompt])
    d["hist"] = pad(hist.astype(np.float32))
  return d


def _log_c_mid_prior(pts: Sequence[CurvePoints]) -> Tuple[float, float]:
  log_c = np.log(np.concatenate([p.compute[p.compute > 0] for p in pts]))
  return float((log_c.min() + log_c.max()) / 2), float(max(1.5, log_c.max() - log_c.min()))


MODELS = {"sigmoid": sigmoid_model, "seeds": seeds_model}


@functools.partial(jax.jit, static_argnames=("model_name", "likelihood", "fit_r0", "num_warmup", "num_samples",
                                             "wander"))
def _nuts_chain(rng_key, data, *, model_name: str, likelihood: str, fit_r0: bool, num_warmup: int,
                num_samples: int, wander: str = "none"):
  """One NUTS chain (dense mass matrix, target acceptance 0.9) as a single jitted scan over warmup + samples.

  Built from numpyro's functional `hmc` API rather than `MCMC`, whose sampling loop is re-traced and
  re-compiled on every run: here the data are traced arguments, so a second fit of the same shapes and
  configuration reuses the compiled program (about 0.2 s instead of 5-20 s of XLA compilation on 2 cores).
  """
  model = functools.partial(MODELS[model_name], likelihood=likelihood, fit_r0=fit_r0, wander=wander)
  init_key, chain_key = jax.random.split(rng_key)
  info = initialize_model(init_key, model, model_args=(data,), dynamic_args=True)
  init_kernel, sample_kernel = hmc(potential_fn_gen=info.potential_fn, algo="NUTS")
  state = init_kernel(info.param_info, num_warmup, dense_mass=True, target_accept_prob=0.9, model_args=(data,),
                      rng_key=chain_key)

  def step(s, _):  # one scan (not warmup + sampling scans) so the NUTS kernel is compiled once
    s = sample_kernel(s, model_args=(data,))
    return s, (s.z, s.diverging)

  _, (z, diverging) = jax.lax.scan(step, state, None, length=num_warmup + num_samples)
  z = jax.tree.map(lambda v: v[num_warmup:], z)
  return jax.vmap(info.postprocess_fn(data))(z), diverging[num_warmup:]


def _run(model_name, data, likelihood, fit_r0, num_warmup, num_samples, num_chains, seed, pts,
         wander: str = "none") -> BayesFit:
  if wander not in WANDERS:
    raise CurveDataError(f"unknown wander {wander!r}; choose one of {WANDERS}")
  x_scale = float(max(p.compute[-1] for p in pts))
  data = {**data, "x": (data["c"] / x_scale).astype(np.float32)}
  del data["c"]
  data = jax.tree.map(jnp.asarray, data)
  keys = jax.random.split(jax.random.PRNGKey(seed), num_chains)
  runs = [_nuts_chain(k, data, model_name=model_name, likelihood=likelihood, fit_r0=fit_r0,
                      num_warmup=num_warmup, num_samples=num_samples, wander=wander) for k in keys]
  keep = ("A", "B", "C_mid", "R0", "sigma", "phi", "mu_log_B", "mu_log_C_mid",  # (mu_*: seeds model, recipe level)
          "wander_sigma", "wander_ell", "wander_f")
  grouped = {k: np.stack([np.asarray(r[0][k], dtype=float) for r in runs]) for k in keep if k in runs[0][0]}
  samples = {k: v.reshape((-1,) + v.shape[2:]) for k, v in grouped.items()}
  chains = [grouped[k].reshape(num_chains, num_samples, -1) for k in ("A", "B", "C_mid")]
  diag = {"divergences": int(sum(np.sum(np.asarray(r[1])) for r in runs)),
          "ess_min": float(min(np.min(effective_sample_size(x)) for x in chains)),
          "r_hat_max": float(max(np.max(split_gelman_rubin(x)) for x in chains))}
  totals = np.concatenate([p.n_total if p.has_counts else np.zeros(0) for p in pts])
  n_total = float(np.median(totals)) if totals.size else 0.0
  n_prompts = int(pts[0].per_prompt.shape[1]) if pts[0].per_prompt is not None else 0
  return BayesFit(samples, likelihood, n_total, n_prompts, diag, wander, tuple(p.compute / x_scale for p in pts),
                  x_scale)


def _check_points(p: CurvePoints, fit_r0: bool):
  if int(np.sum(p.compute > 0)) < MIN_FIT_POINTS:
    raise CurveDataError(f"{p.name or 'run'}: need >= {MIN_FIT_POINTS} points with C > 0 to fit, got "
                         f"{int(np.sum(p.compute > 0))}")
  if np.any(p.compute <= 0) and not fit_r0:
    raise CurveDataError("points at C = 0 measure R0: drop them or pass fit_r0=True")


def fit_bayes(points: CurvePoints, r0: float, *, likelihood: str = "auto", fit_r0: bool = False,
              num_warmup: int = 500, num_samples: int = 1000, num_chains: int = 1, seed: int = 0,
              wander: str = "none", prior: Optional[CurvePrior] = None, c_per_step: Optional[float] = None,
              a_max: Optional[float] = None) -> BayesFit:
  """Posterior of (A, B, C_mid[, R0]) for one run's fitted points (e.g. `Window.fit`) by NUTS.

  With fit_r0, `points` may include the start point at C = 0, and `r0` is unused. `prior` (prior.CurvePrior, with
  the run's compute per RL step `c_per_step`) replaces the generic priors of ln B and ln C_mid by one learned from
  finished runs; `a_max` bounds A from above (e.g. the base policy's pass@k, prior.bound_on_a).
  """
  _check_points(points, fit_r0)
  likelihood = _resolve(likelihood, [points])
  n_pad = -(-len(points) // PAD) * PAD
  data = _arrays(points, n_pad, likelihood)
  loc, scale = _log_c_mid_prior([points]) if prior is None else prior.log_c_mid(c_per_step or 0.0)
  b_loc, b_scale = LOG_B_PRIOR if prior is None else prior.log_b()
  if a_max is not None and not 0.0 < a_max <= 1.0:
    raise CurveDataError(f"the bound on A must lie in (0, 1], got {a_max!r}")
  data.update(r0=np.float32(r0), loc=np.float32(loc), scale=np.float32(scale), b_loc=np.float32(b_loc),
              b_scale=np.float32(b_scale), a_max=np.float32(1.0 if a_max is None else a_max))
  return _run("sigmoid", data, likelihood, fit_r0, num_warmup, num_samples, num_chains, seed, [points], wander)


def fit_bayes_seeds(points: Sequence[CurvePoints], r0: Sequence[float], *, likelihood: str = "auto",
                    fit_r0: bool = False, num_warmup: int = 500, num_samples: int = 1000, num_chains: int = 1,
                    seed: int = 0, wander: str = "none") -> BayesFit:
  """Hierarchical posterior over K seeds of one recipe with one shared A; B and C_mid come out [S, K] (and R0
  with fit_r0: then each run's points may include its C = 0 evaluation, and `r0` is unused)."""
  if len(points) != len(r0) or len(points) < 2:
    raise CurveDataError("fit_bayes_seeds needs >= 2 runs and one R0 per run")
  for p in points:
    _check_points(p, fit_r0)
  likelihood = _resolve(likelihood, points)
  if likelihood == "betabinomial" and len({p.samples_per_prompt for p in points}) > 1:
    raise CurveDataError("seeds must share samples_per_prompt for the betabinomial likelihood")
  n_pad = -(-max(len(p) for p in points) // PAD) * PAD
  per = [_arrays(p, n_pad, likelihood) for p in points]
  data = {k: np.stack([d[k] for d in per]) for k in per[0]}
  loc, scale = _log_c_mid_prior(points)
  data.update(r0=np.asarray(r0, np.float32), loc=np.float32(loc), scale=np.float32(scale))
  return _run("seeds", data, likelihood, fit_r0, num_warmup, num_samples, num_chains, seed, list(points), wander)
