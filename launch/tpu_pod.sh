#!/usr/bin/env bash
# Installs this repository on every worker of a Cloud TPU VM (a v5e/v6e/v4/v5p pod slice) and starts
# launch/train.py on all of them; jax.distributed auto-detects the slice, so no coordinator flags are passed.
#
#   launch/tpu_pod.sh --tpu NAME --zone ZONE --project PROJECT [--repo URL_OR_PATH] [--ref GIT_REF]
#                     [--config FILE] [--run-dir DIR] [--python PY] [--dry-run] [-- OVERRIDE ...]
#
# Three gcloud commands, printed one per line (shell-quoted) by --dry-run instead of being run:
#   1. --worker=all: clone/fetch the repo at the ref into ~/scalerl_jax, make a venv, pip install it with jax[tpu];
#   2. --worker=all: start train.py detached (HUP ignored, stdin closed), its output in ~/scalerl_jax/logs/STAMP.log on
#      each worker, its pid and exit status next to it. The ssh sessions return at once, so a dropped connection
#      cannot kill the run, and all workers start within seconds of each other (jax waits for all of them);
#   3. --worker=0: `tail -F --pid` of worker 0's log, which ends when its trainer exits, with the trainer's
#      exit status. Ctrl-C stops only the streaming; the run goes on (re-attach with the printed command).
# gcloud runs the --worker=all sessions concurrently, one per worker, and exits non-zero if any of them failed.
# Training in the foreground of --worker=all instead would mix every worker's output, unlabelled, into one
# stream, and a dropped connection would end the run.
set -euo pipefail

PROG=tpu_pod.sh
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REMOTE_DIR=scalerl_jax  # under the worker's home directory

usage() {
  cat >&2 <<EOF
usage: $PROG --tpu NAME --zone ZONE --project PROJECT [--repo URL_OR_PATH] [--ref GIT_REF]
             [--config FILE] [--run-dir DIR] [--python PY] [--dry-run] [-- OVERRIDE ...]
  --repo     what every worker clones (default: this checkout's git remote); it must be reachable from the workers
  --ref      branch, tag or commit to install (default: HEAD's commit, which must be pushed to --repo)
  --config   train.py config, relative to the repository (default: configs/scalerl_8b.yaml)
  --run-dir  passed to train.py as run_dir=DIR (a place all workers share, e.g. a bucket)
  --python   interpreter on the workers that makes the venv (default: python3.11)
  --dry-run  print the gcloud commands, one per line, and run none
  after --    passed to train.py unchanged (key=value overrides, or its flags)
EOF
}

die_usage() { echo "$PROG: error: $1" >&2; usage; exit 2; }
die() { echo "$PROG: error: $1" >&2; exit 1; }

# One word as a shell reads it back: bare when that is safe, else single-quoted.
quote() {
  local sq="'\\''"
  if [[ $1 =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/"$sq"}"; fi
}
quote_all() { local w out=(); for w; do out+=("$(quote "$w")"); done; printf '%s' "${out[*]}"; }

tpu="" zone="" project="" repo="" ref="" config=configs/scalerl_8b.yaml run_dir="" python=python3.11 dry_run=0
overrides=()
while (($#)); do
  flag=$1
  case $flag in
    --dry-run) dry_run=1; shift; continue ;;
    --) shift; overrides=("$@"); break ;;
    --tpu|--zone|--project|--repo|--ref|--config|--run-dir|--python)
      (($# >= 2)) && [[ $2 != --* ]] || die_usage "$flag needs a value"
      value=$2; shift 2 ;;
    --tpu=*|--zone=*|--project=*|--repo=*|--ref=*|--config=*|--run-dir=*|--python=*)
      value=${flag#*=}; flag=${flag%%=*}; shift ;;
    *) die_usage "unknown argument: $flag" ;;
  esac
  [[ -n $value ]] || die_usage "$flag needs a value"
  case $flag in
    --tpu) tpu=$value ;; --zone) zone=$value ;; --project) project=$value ;; --repo) repo=$value ;;
    --ref) ref=$value ;; --config) config=$value ;; --run-dir) run_dir=$value ;; --python) python=$value ;;
  esac
done
for required in tpu zone project; do
  [[ -n ${!required} ]] || die_usage "--$required is required"
done
if [[ -z $repo ]]; then
  remotes=$(git -C "$ROOT" remote 2>/dev/null) || true
  remote=$(grep -x origin <<<"$remotes" || head -n1 <<<"$remotes")
  [[ -n $remote ]] || die_usage "--repo is required: $ROOT has no git remote to default to"
  repo=$(git -C "$ROOT" remote get-url "$remote")
fi
if [[ $ref =~ ^[0-9a-f]{4,39}$ ]]; then  # git fetch needs a commit's full name
  full=$(git -C "$ROOT" rev-parse --verify --quiet "$ref^{commit}" 2>/dev/null) ||
    die_usage "--ref $ref: an abbreviated commit that this checkout cannot expand; give all 40 digits"
  ref=$full
elif [[ -z $ref ]]; then
  ref=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null) || die_usage "--ref is required: $ROOT is not a git checkout"
  if [[ -n $(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    echo "$PROG: warning: uncommitted changes in $ROOT are not installed (the workers get $ref)" >&2
  fi
fi

train_args=(.venv/bin/python launch/train.py --config "$config")
[[ -n $run_dir ]] && train_args+=("run_dir=$run_dir")
train_args+=("${overrides[@]}")
stamp=$(date -u +%Y%m%dT%H%M%SZ)
log=logs/$stamp  # .log, .pid, .rc on each worker, relative to ~/$REMOTE_DIR

# Worker-side shell commands. `cd ~/...` stays unquoted so that the worker's shell expands ~.
install="{ test -d ~/$REMOTE_DIR/.git || git clone --quiet $(quote "$repo") ~/$REMOTE_DIR; }"
install+=" && cd ~/$REMOTE_DIR && git remote set-url origin $(quote "$repo")"
install+=" && git fetch --quiet origin $(quote "$ref") && git checkout --quiet --detach FETCH_HEAD"
install+=" && { command -v $(quote "$python") >/dev/null"
install+=" || { echo \"\$(hostname):\" $(quote "$python not found: install it or pass --python") >&2; exit 1; }; }"
install+=" && $(quote "$python") -m venv .venv && .venv/bin/pip install --quiet -r requirements.txt -e '.[tpu]'"
# A detached subshell runs the trainer, then records its exit status; HUP is ignored (as nohup would) in case
# the ssh session is torn down with a hangup. $! is that subshell, which `tail --pid` of step 3 waits for.
start="cd ~/$REMOTE_DIR && mkdir -p logs || exit 1; ( trap '' HUP; PYTHONUNBUFFERED=1"
start+=" $(quote_all "${train_args[@]}"); echo \$? > $log.rc ) > $log.log 2>&1 < /dev/null & echo \$! > $log.pid"
stream="cd ~/$REMOTE_DIR && tail -n +1 -F --pid=\"\$(cat $log.pid)\" $log.log 2>/dev/null"
stream+="; exit \"\$(cat $log.rc 2>/dev/null || echo 1)\""

ssh=(gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --project "$project")
cmd_install=("${ssh[@]}" --worker=all --command "$install")
cmd_start=("${ssh[@]}" --worker=all --command "$start")
cmd_stream=("${ssh[@]}" --worker=0 --command "$stream")

if ((dry_run)); then
  for name in cmd_install cmd_start cmd_stream; do
    declare -n cmd=$name
    quote_all "${cmd[@]}"; echo
    unset -n cmd
  done
  exit 0
fi
command -v gcloud >/dev/null || die "gcloud not found on PATH: see https://cloud.google.com/sdk/docs/install"
"${cmd_install[@]}"
"${cmd_start[@]}"
echo "$PROG: started on all workers of $tpu; worker 0's log follows (Ctrl-C stops the streaming, not the run). " \
  "Re-attach: $(quote_all "${cmd_stream[@]}")" >&2
"${cmd_stream[@]}"
