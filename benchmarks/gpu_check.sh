#!/usr/bin/env bash
# One-shot GPU check: train-step MFU (bf16) and decode tokens/s of a ~0.5B dense config and a small MoE, the
# sampler-vs-trainer log-prob gap in fp32 at default vs highest matmul precision, and a short PipelineRL run on
# one GPU; prints one table. Made for one H200 host with jax 0.11.x installed and no network: whatever else the
# project imports comes from a wheel directory prepared beforehand on a machine with network.
#
#   benchmarks/gpu_check.sh --prepare-wheels DIR [--python-version 3.12]   # with network: runs the CPU smoke,
#                                        # records the distributions it imported, downloads their wheels (pinned
#                                        # to this venv's versions, no deps, jax & co. excluded) into DIR (< 64 MiB)
#   benchmarks/gpu_check.sh [--wheels DIR] [--out DIR]                   # the GPU host: installs what is missing
#                                        # into OUT/site (nothing else touched), then runs the check (< 8 min)
#   benchmarks/gpu_check.sh --cpu-smoke                                  # tiny configs on CPU (< 2 min)
#
# PYTHON picks the interpreter (default: python3). Every step runs under `timeout`; one that fails or times out
# is reported in the table and the others still run. Results (JSON with date, machine, command) land in OUT
# (default benchmarks/results/gpu_check, or /tmp/gpu_check_smoke for the smoke).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
MODE=gpu WHEELS="$ROOT/benchmarks/wheels" OUT="" PYVER=3.12
while (($#)); do
  case "$1" in
    --prepare-wheels) MODE=prepare WHEELS="$2"; shift 2 ;;
    --python-version) PYVER="$2"; shift 2 ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --cpu-smoke) MODE=smoke; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# Runs a script as __main__ with its folder on sys.path (as `python script.py`); with GPU_CHECK_IMPORTS set it
# appends the distributions of every module imported to that file at exit.
RUNNER='
import atexit, os, runpy, sys
record = os.environ.get("GPU_CHECK_IMPORTS")
if record:
  def dump():
    import importlib.metadata as md
    dists = md.packages_distributions()
    names = sorted({d for m in list(sys.modules) for d in dists.get(m.split(".")[0], [])})
    with open(record, "a") as f:
      f.write("\n".join(names) + "\n")
  atexit.register(dump)
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
'
STATUS=()
step() {  # step NAME SECONDS SCRIPT ARGS...: one timed python step, its log in OUT/NAME.log
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$PY" -c "$RUNNER" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 12 "$OUT/$name.log"
  STATUS+=("$name rc=$rc $((SECONDS - t0))s")
  return 0
}

if [[ $MODE == prepare ]]; then
  OUT="$(mktemp -d)"
  if [[ -n ${GPU_CHECK_IMPORTS_FROM:-} ]]; then  # a list recorded before (skips the smoke run)
    cp "$GPU_CHECK_IMPORTS_FROM" "$OUT/imports.txt"
  else
    echo "running the CPU smoke to record what the check imports (log in $OUT)"
    GPU_CHECK_IMPORTS="$OUT/imports.txt" PYTHON="$PY" "$0" --cpu-smoke --out "$OUT/smoke" || exit 1
  fi
  # the recorded distributions and everything they require (an import the smoke did not reach may need it),
  # pinned to this environment's versions, less what the jax install brings and the project itself
  # shellcheck disable=SC2046
  mapfile -t PINS < <("$PY" - "$PYVER" $(sort -u "$OUT/imports.txt") <<'EOF'
import importlib.metadata as md, re, sys
from packaging.requirements import Requirement
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
env = {"python_version": sys.argv[1], "python_full_version": sys.argv[1] + ".0", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "extra": "",
       "implementation_name": "cpython", "platform_python_implementation": "CPython"}
skip = re.compile(r"jax|jaxlib|jax-cuda.*|jax-plugins.*|numpy|scipy|ml-dtypes|opt-einsum|scalerl-jax|setuptools|pip|"
                  r"wheel|nvidia-.*")
seen, todo = {}, list(sys.argv[2:])
while todo:
  name = todo.pop()
  if norm(name) in seen or skip.fullmatch(norm(name)):  # the jax install's (and the project's) own
    continue
  try:
    dist = md.distribution(name)
  except md.PackageNotFoundError:
    continue
  seen[norm(name)] = f"{dist.metadata['Name']}=={dist.version}"
  for line in dist.requires or []:
    req = Requirement(line)
    if req.marker is None or req.marker.evaluate(env):
      todo.append(req.name)
print("\n".join(pin for _, pin in sorted(seen.items())))
EOF
)
  mkdir -p "$WHEELS"
  echo "downloading ${#PINS[@]} wheels for CPython $PYVER manylinux x86_64: ${PINS[*]}"
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 -d "$WHEELS" "${PINS[@]}" || exit 1
  size=$(du -sm "$WHEELS" | cut -f1)
  echo "$WHEELS: $(ls "$WHEELS" | wc -l) wheels, ${size} MiB"
  ((size < 64)) || { echo "gpu_check.sh: the wheels take ${size} MiB, over the 64 MiB a device run carries" >&2
                     exit 1; }
  exit 0
fi

if [[ $MODE == smoke ]]; then
  OUT="${OUT:-/tmp/gpu_check_smoke}"
  export JAX_PLATFORMS=cpu
else
  OUT="${OUT:-$ROOT/benchmarks/results/gpu_check}"
fi
mkdir -p "$OUT"
export PYTHONPATH="$ROOT:$OUT/site${PYTHONPATH:+:$PYTHONPATH}"

if [[ $MODE == gpu ]]; then
  # what the wheel directory holds and this Python lacks, installed into OUT/site (no index, no deps)
  MISSING=$("$PY" - "$WHEELS" <<'EOF'
import importlib.metadata as md, pathlib, re, sys
folder = pathlib.Path(sys.argv[1])
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
have = {norm(d.metadata["Name"]) for d in md.distributions() if d.metadata["Name"]}
for wheel in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
  if norm(wheel.name.split("-")[0]) not in have:
    print(wheel)
EOF
)
  if [[ -n $MISSING ]]; then
    echo "installing into $OUT/site: $(echo "$MISSING" | xargs -n1 basename | tr '\n' ' ')"
    # shellcheck disable=SC2086
    "$PY" -m pip install --no-index --no-deps --quiet --target "$OUT/site" $MISSING || exit 1
  fi
  "$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())'
  "$PY" -c 'import scalerl_jax.run.job, scalerl_jax.rollout.engine' || {
    echo "gpu_check.sh: the project does not import; a dependency is missing from $WHEELS" >&2; exit 1; }
fi

if [[ $MODE == smoke ]]; then
  MFU=(--configs tiny,tiny_moe --dtype float32 --steps 2 --decode --decode-slots 8 --decode-new 8)
  GAP=(--config tiny --prompts 2 --samples 2 --prompt-len 8 --new 8)
  RUN=(pipeline.steps=3 data.prompts_per_step=8 data.num_eval=16 rollout.max_slots=64)
  LIMITS=(100 60 100)
else
  MFU=(--configs 0.5b,moe --dtype bfloat16 --steps 5 --decode --peak-n 8192)
  GAP=(--config 36m)
  RUN=(pipeline.steps=20 pipeline.max_lag=1)
  LIMITS=(220 80 130)
fi
# fp32 compute everywhere below except the bf16 MFU step: the matmul precision is set explicitly (XLA's default
# may run fp32 dots on GPU in TF32); the log-prob gap step sets its own precisions
step mfu "${LIMITS[0]}" "$ROOT/benchmarks/mfu.py" "${MFU[@]}" --out "$OUT/mfu.json"
step logprob_gap "${LIMITS[1]}" "$ROOT/benchmarks/logprob_gap.py" "${GAP[@]}" --out "$OUT/logprob_gap.json"
export JAX_DEFAULT_MATMUL_PRECISION=highest
step pipeline_rl "${LIMITS[2]}" "$ROOT/launch/train.py" \
    run_dir="$OUT/run" checkpoint.resume=false warm_start.enabled=false pipeline.eval_every=1000 \
    checkpoint.every_steps=1000 curve_fit.bayes=false "${RUN[@]}" --overwrite
unset JAX_DEFAULT_MATMUL_PRECISION

"$PY" - "$OUT" "${STATUS[@]}" <<'EOF'
import json, pathlib, statistics, sys
out, status = pathlib.Path(sys.argv[1]), sys.argv[2:]
def load(name):
  p = out / name
  return json.loads(p.read_text()) if p.exists() else None
print("\n== gpu_check summary (" + out.as_posix() + ")")
mfu = load("mfu.json")
if mfu:
  m = mfu["machine_detail"]
  print(f"machine: {m['device']} x{m['devices']}, jax {m['jax']}, {mfu['date']}; "
        f"peak {mfu['peak_flop_s']['median'] / 1e12:.2f} TFLOP/s ({mfu['peak_flop_s']['matmul']})")
  print(f"{'config':<8} {'params':>8} {'dtype':>9} {'step s':>8} {'train tok/s':>12} {'TFLOP/s':>8} {'MFU':>6} "
        f"{'decode tok/s':>13}")
  for name, r in mfu["configs"].items():
    dec = r.get("decode", {}).get("tok_s", float("nan"))
    print(f"{name:<8} {r['params'] / 1e6:>7.1f}M {mfu['dtype']:>9} {r['step_s_median']:>8.3f} {r['tok_s']:>12.0f} "
          f"{r['flop_s'] / 1e12:>8.2f} {r['mfu']:>6.1%} {dec:>13.0f}")
gap = load("logprob_gap.json")
if gap:
  for r in gap["rows"]:
    print(f"log-prob gap sampler vs trainer, {gap['config']} fp32, precision {r['precision']:<8}: "
          f"max {r['max_abs']:.2e}, mean {r['mean_abs']:.2e} over {r['tokens']} tokens")
metrics = out / "run" / "metrics.jsonl"
if metrics.exists():
  rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
  steps = [r for r in rows if "train/tokens_per_s" in r]
  if steps:
    tps = statistics.median(r["train/tokens_per_s"] for r in steps[1:] or steps)
    rps = statistics.median(r["rollout/tokens_per_s"] for r in steps[1:] or steps)
    print(f"PipelineRL ({len(steps)} steps, one device): median train {tps:.0f} tok/s, rollout {rps:.0f} tok/s "
          "(first step, with compilation, left out)")
print("steps: " + "; ".join(status))
EOF
