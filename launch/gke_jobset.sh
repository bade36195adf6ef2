#!/usr/bin/env bash
# Renders launch/gke_jobset.yaml (a JobSet: one pod per TPU VM host of a GKE TPU slice, each running
# launch/train.py; jax auto-detects the slice) and applies it with `kubectl apply -f -`.
#
#   launch/gke_jobset.sh --name NAME --image IMAGE --accelerator ACCEL --topology TOPO --hosts N
#                        [--chips-per-host C] [--config FILE] [--dry-run] [-- OVERRIDE ...]
#
# --dry-run prints the command instead of running it: `kubectl apply -f - <<'EOF'`, the manifest, `EOF` (so the
# output can be read, or piped to bash to apply it as it is).
set -euo pipefail

PROG=gke_jobset.sh
TEMPLATE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gke_jobset.yaml

usage() {
  cat >&2 <<EOF
usage: $PROG --name NAME --image IMAGE --accelerator ACCEL --topology TOPO --hosts N
             [--chips-per-host C] [--config FILE] [--dry-run] [-- OVERRIDE ...]
  --name            JobSet name (lowercase letters, digits and '-', at most 40 characters)
  --image           container image holding this repository in its working directory, with jax[tpu]
  --accelerator     GKE TPU accelerator, e.g. tpu-v5-lite-podslice, tpu-v6e-slice, tpu-v5p-slice
  --topology        slice topology, e.g. 4x4 (v5e/v6e) or 2x2x4 (v4/v5p)
  --hosts           TPU VM hosts in the slice: chips in the topology / chips per host
  --chips-per-host  google.com/tpu per pod (default: 4)
  --config          train.py config inside the image (default: configs/scalerl_8b.yaml)
  --dry-run         print the kubectl command with the manifest, and run nothing
  after --           passed to train.py unchanged (key=value overrides, or its flags)
EOF
}

die_usage() { echo "$PROG: error: $1" >&2; usage; exit 2; }

# A YAML double-quoted scalar (JSON string syntax).
yaml_str() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\t'/\\t}
  printf '"%s"' "$s"
}

name="" image="" accelerator="" topology="" hosts="" chips=4 config=configs/scalerl_8b.yaml dry_run=0
overrides=()
while (($#)); do
  flag=$1
  case $flag in
    --dry-run) dry_run=1; shift; continue ;;
    --) shift; overrides=("$@"); break ;;
    --name|--image|--accelerator|--topology|--hosts|--chips-per-host|--config)
      (($# >= 2)) && [[ $2 != --* ]] || die_usage "$flag needs a value"
      value=$2; shift 2 ;;
    --name=*|--image=*|--accelerator=*|--topology=*|--hosts=*|--chips-per-host=*|--config=*)
      value=${flag#*=}; flag=${flag%%=*}; shift ;;
    *) die_usage "unknown argument: $flag" ;;
  esac
  [[ -n $value ]] || die_usage "$flag needs a value"
  case $flag in
    --name) name=$value ;; --image) image=$value ;; --accelerator) accelerator=$value ;;
    --topology) topology=$value ;; --hosts) hosts=$value ;; --chips-per-host) chips=$value ;;
    --config) config=$value ;;
  esac
done
for required in name image accelerator topology hosts; do
  [[ -n ${!required} ]] || die_usage "--$required is required"
done
# JobSet derives job, pod and host names (NAME-workers-0-K-xxxxx) from the name; they must stay DNS labels
[[ $name =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ && ${#name} -le 40 ]] ||
  die_usage "--name $name: use lowercase letters, digits and '-' (starting with a letter), at most 40 characters"
[[ $accelerator =~ ^[a-z0-9-]+$ ]] || die_usage "--accelerator $accelerator: expected a name like tpu-v5-lite-podslice"
[[ $topology =~ ^[1-9][0-9]*(x[1-9][0-9]*)+$ ]] || die_usage "--topology $topology: expected e.g. 4x4 or 2x2x4"
[[ $hosts =~ ^[1-9][0-9]*$ ]] || die_usage "--hosts $hosts: expected a positive integer"
[[ $chips =~ ^[1-9][0-9]*$ ]] || die_usage "--chips-per-host $chips: expected a positive integer"
slice_chips=$((${topology//x/*}))
((hosts * chips == slice_chips)) ||
  die_usage "--hosts $hosts x --chips-per-host $chips = $((hosts * chips)) chips; --topology $topology has $slice_chips"

command=""
for word in python launch/train.py --config "$config" "${overrides[@]}"; do
  command+="${command:+, }$(yaml_str "$word")"
done
manifest=$(<"$TEMPLATE")
manifest=${manifest//@NAME@/"$name"}
manifest=${manifest//@IMAGE@/"$(yaml_str "$image")"}
manifest=${manifest//@ACCELERATOR@/"$accelerator"}
manifest=${manifest//@TOPOLOGY@/"$(yaml_str "$topology")"}
manifest=${manifest//@HOSTS@/"$hosts"}
manifest=${manifest//@CHIPS@/"$chips"}
manifest=${manifest//@COMMAND@/"[$command]"}

if ((dry_run)); then
  printf "kubectl apply -f - <<'EOF'\n%s\nEOF\n" "$manifest"
  exit 0
fi
if ! command -v kubectl >/dev/null; then
  echo "$PROG: error: kubectl not found on PATH (gcloud components install kubectl, then get-credentials)" >&2
  exit 1
fi
printf '%s\n' "$manifest" | kubectl apply -f -
