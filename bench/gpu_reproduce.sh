#!/usr/bin/env bash
# `fathom reproduce seed-003` on one GPU (sized for one H200 in ~10 minutes), writing
# RESULTS.md-ready output.
#
# STATUS: NOT RUN. No GPU was lent to the session that wrote it; nothing in RESULTS.md or
# BENCHMARKS.md comes from it yet.
#
# What it runs: seeds 002/003's protocol with frozen learning rates (0.03 plain, 0.01 every
# residual recipe, no tuning run): 15 main runs of 100 epochs (five recipes x seeds
# 101-103, full width, batch 64, TF32, CUDA graphs), then the audit of every branch mask at
# the selected and final checkpoints on the GPU, the 21 curvature snapshots (residual,
# constant SD, decreasing SD; seed 101; epochs 0, 1, 5, 10, 20, 50, 100; float64 on the
# GPU), the head diagnostic pair (seed 104, 5 epochs), the comparison with the seeds'
# numbers and the report. Every step is resumable: rerunning the script after a timeout
# continues where it stopped (complete and verified steps are skipped).
#
# Budget: ~24 s of training clock per 100-epoch run on an H200
# (docs/benchmarks-history.md#gpu-fast-path), ~35 s elapsed with evaluation and telemetry;
# WORKERS=3 processes share the one GPU (the batch-64 step is launch-bound, so processes
# overlap): ~3-4 min for the study, then ~2-4 min for audit, curvature, head and report. If
# the budget runs out, rerun: the printed step lines say exactly which steps completed.
#
# On the device machine (nothing outside it is reachable), MNIST must travel with the tree:
#   mkdir -p runs/.data-cache && cp -r ~/.cache/fathom/mnist runs/.data-cache/
#   run(command="bash bench/gpu_reproduce.sh", carry=["runs/.data-cache"], timeout_s=600)
# Outputs: $OUT/reproduce/ (reproduction.md/json, summary, audit, curvature, head, timings,
# RESULTS-$PRESET.md) when $OUT is set, else runs/gpu-reproduce/.
#
# PRESET=seed-000 (seed 000's CIFAR-100 depth-scaling protocol, `fathom reproduce seed-000`):
# 5 depths x 2 arms of spiking LIF conv nets, T=4, 150 epochs; the log's own run took 36 h on
# one A40, so it does NOT fit a 15-minute device budget: EPOCHS=N runs the same protocol with
# N epochs (the comparison then labels itself scaled down). Sizing, NOT measured: the log's
# rate is ~86 s per run-epoch on the A40 (36 h / (10 runs x 150 epochs)); at an assumed ~3x on
# an H200, EPOCHS=3 (30 run-epochs) would take ~15 min, so try EPOCHS=2 with WORKERS=2 first. CIFAR-100 is supplied by the user:
# CIFAR_DIR=DIR holding cifar-100-python.tar.gz (169 MB: more than a device call can carry, so
# it must already be on the GPU machine). Its table prints beside the log's, with the verdicts.
#   DRY=1 PRESET=seed-000 bash bench/gpu_reproduce.sh        # plan and checks only
#   PRESET=seed-000-tiny DEVICE=cpu bash bench/gpu_reproduce.sh
#       # the CPU scaled path: a synthetic CIFAR-100-format archive (bench/seed000_tiny.py)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORKERS=${WORKERS:-3}
PRESET=${PRESET:-seed-003}   # PRESET=quick DEVICE=cpu: the same script on a CPU
DEVICE=${DEVICE:-cuda}
DRY=${DRY:-0}                # DRY=1: write and validate the pipeline file, then stop
RUNS=${RUNS:-runs/gpu-reproduce}
DEST=${OUT:-runs/gpu-reproduce}/reproduce
mkdir -p "$RUNS" "$DEST"
if [ -d runs/.data-cache ]; then export FATHOM_CACHE="$PWD/runs/.data-cache"; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

{
  echo "# fathom reproduce $PRESET on $(hostname)"
  date -u +"started %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')"
} | tee "$DEST/machine.txt"

kind=$($PY -c "import sys, tomllib; from importlib import resources; p = tomllib.loads((resources.files('fathom') / 'reproduce' / 'pipelines.toml').read_text())[sys.argv[1]]; print('depth' if 'depth_scaling' in p else 'study')" "$PRESET")
if [ "$kind" = depth ]; then
  # seed 000: a depth-scaling pipeline file with this machine's device (and EPOCHS, if set)
  $PY - "$DEST/$PRESET.toml" "$PRESET" "$DEVICE" "${EPOCHS:-}" <<'PY'
import sys, tomllib
from importlib import resources
path, preset, dev, epochs = sys.argv[1:]
p = tomllib.loads((resources.files("fathom") / "reproduce" / "pipelines.toml").read_text())[preset]
over = [f'device = "{dev}"'] + ([f"epochs = {int(epochs)}"] if epochs else [])
open(path, "w").write(
    f'description = "{p["description"]} (bench/gpu_reproduce.sh)"\n'
    f'depth_scaling = {{ config = "{p["depth_scaling"]["config"]}", overrides = {{ {", ".join(over)} }} }}\n'
)
PY
  $PY -c "import sys; from fathom.reproduce.config import load_pipeline; from fathom.depthscale.config import protocol_reductions; n, p, c, o = load_pipeline(sys.argv[1]); print('pipeline', o, '->', n, ':', c.dataset, 'depths', c.depths, 'T', c.timesteps, 'epochs', c.epochs, 'seeds', c.seeds, 'runs', 2 * len(c.depths) * len(c.seeds), 'device', c.device); print('scaled down:', '; '.join(protocol_reductions(c)) or 'no (the full protocol)')" "$DEST/$PRESET.toml" | tee -a "$DEST/machine.txt"
  CIFAR_DIR=${CIFAR_DIR:-${FATHOM_DATA:-runs/.data-cache}}
  if [ "$PRESET" != seed-000-tiny ]; then
    ls -l "$CIFAR_DIR"/cifar-100-python.tar.gz "$CIFAR_DIR"/cifar100/cifar-100-python.tar.gz 2>/dev/null \
      | tee -a "$DEST/machine.txt" || echo "cifar-100-python.tar.gz not under CIFAR_DIR=$CIFAR_DIR: the run will stop naming the fix" | tee -a "$DEST/machine.txt"
  fi
  [ "$DRY" = 1 ] && exit 0
  start=$(date +%s)
  set +e
  if [ "$PRESET" = seed-000-tiny ]; then   # the CPU scaled path: synthetic archive
    $PY bench/seed000_tiny.py "$DEST/$PRESET.toml" "$RUNS" 2>&1 | tee "$DEST/reproduce.log"
  else
    $PY -m fathom.cli reproduce "$DEST/$PRESET.toml" --runs-dir "$RUNS" --workers "$WORKERS" \
      --data-dir "$CIFAR_DIR" 2>&1 | tee "$DEST/reproduce.log"
  fi
  rc=${PIPESTATUS[0]}
  set -e
  echo "exit $rc after $(( $(date +%s) - start )) s (load: $(cat /proc/loadavg))" | tee -a "$DEST/machine.txt"
  root="$RUNS/$PRESET"
  for f in table.md table.json reproduce/reproduction.md reproduce/reproduction.json reproduce/pipeline.json; do
    [ -f "$root/$f" ] && mkdir -p "$DEST/$(dirname "$f")" && cp "$root/$f" "$DEST/$f"
  done
  {
    echo "## fathom reproduce $PRESET (bench/gpu_reproduce.sh)"
    echo
    sed 's/^/    /' "$DEST/machine.txt"
    echo
    [ -f "$DEST/reproduce/reproduction.md" ] && cat "$DEST/reproduce/reproduction.md"
    [ -f "$DEST/table.md" ] && cat "$DEST/table.md"
  } > "$DEST/RESULTS-$PRESET.md"
  echo "RESULTS-ready: $DEST/RESULTS-$PRESET.md"
  exit "$rc"
fi

# The audit's router needs scikit-learn and the report's figures matplotlib: a copy of the
# seed-003 pipeline switches off only what this machine cannot import (said in the output).
router=true; figures=true
$PY -c "import sklearn" 2>/dev/null || { router=false; echo "scikit-learn missing: audit without the router" | tee -a "$DEST/machine.txt"; }
$PY -c "import matplotlib" 2>/dev/null || { figures=false; echo "matplotlib missing: report without PNG figures" | tee -a "$DEST/machine.txt"; }
$PY - "$DEST/pipeline.toml" "$router" "$figures" "$PRESET" "$DEVICE" <<'PY'
import sys, tomllib
from importlib import resources
presets = tomllib.loads((resources.files("fathom") / "reproduce" / "pipelines.toml").read_text())
p = presets[sys.argv[4]]
dev = sys.argv[5]
lines = [f'description = "{p["description"]} (bench/gpu_reproduce.sh)"', f'study = "{p["study"]}"',
         "[audit]", 'checkpoint = "both"', f'device = "{dev}"', f"router = {sys.argv[2]}",
         "[curvature]", f'recipes = {p["curvature"]["recipes"]}'.replace("'", '"'),
         f'seed = {p["curvature"]["seed"]}', f'epochs = {p["curvature"]["epochs"]}',
         "epoch_map = { " + ", ".join(f'"{k}" = {v}' for k, v in p["curvature"]["epoch_map"].items()) + " }",
         f'probe = {p["curvature"]["probe"]}', f'device = "{dev}"',
         "[head]", *(f"{k} = {v!r}".replace("'", '"') for k, v in p["head"].items()),
         "[report]", f"figures = {sys.argv[3]}"]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
$PY -c "import sys; from fathom.reproduce.config import load_pipeline; n, p, s, o = load_pipeline(sys.argv[1]); print('pipeline', o, 'study', s.study.name, 'audit on', p.audit.device, 'curvature', len(p.curvature.recipes) * len(p.curvature.epochs), 'snapshots')" "$DEST/pipeline.toml"
[ "$DRY" = 1 ] && exit 0

$PY -m fathom.cli data verify mnist | tee -a "$DEST/machine.txt"
start=$(date +%s)
set +e
$PY -m fathom.cli reproduce "$DEST/pipeline.toml" --runs-dir "$RUNS" \
  --workers "$WORKERS" 2>&1 | tee "$DEST/reproduce.log"
rc=${PIPESTATUS[0]}
set -e
echo "exit $rc after $(( $(date +%s) - start )) s (load: $(cat /proc/loadavg))" | tee -a "$DEST/machine.txt"

study="$RUNS/$($PY -c "import sys; from fathom.reproduce.config import load_pipeline; print(load_pipeline(sys.argv[1])[2].study.name)" "$DEST/pipeline.toml")"
for f in summary.md summary.json audit/audit.md audit/audit.json reproduce/reproduction.md \
         reproduce/reproduction.json reproduce/pipeline.json; do
  [ -f "$study/$f" ] && mkdir -p "$DEST/$(dirname "$f")" && cp "$study/$f" "$DEST/$f"
done
for r in residual sd_constant sd_decreasing; do
  d="$study/main-$r-s101/curvature"
  [ -d "$d" ] && mkdir -p "$DEST/curvature/$r" && cp "$d"/summary.* "$DEST/curvature/$r/"
done
[ -f "$study-head/head.md" ] && cp "$study-head"/head.* "$DEST/"

# RESULTS.md-ready: machine, step wall times, the seed tables beside Fathom's
{
  echo "## fathom reproduce $PRESET (bench/gpu_reproduce.sh)"
  echo
  sed 's/^/    /' "$DEST/machine.txt"
  echo
  [ -f "$DEST/reproduce/pipeline.json" ] && $PY - "$DEST/reproduce/pipeline.json" <<'PY'
import json, sys
steps = json.load(open(sys.argv[1]))["steps"]
print("| step | wall (s) |\n|---|---|")
for name, rec in steps.items():
    print(f"| {name} | {rec['wall_s']:.1f} |")
missing = [s for s in ("study", "audit", "head", "compare", "report") if s not in steps]
print(f"\nSteps not completed in this invocation: {', '.join(missing) or 'none'}.\n")
PY
  [ -f "$DEST/reproduce/reproduction.md" ] && cat "$DEST/reproduce/reproduction.md"
  [ -f "$DEST/head.md" ] && cat "$DEST/head.md"
} > "$DEST/RESULTS-$PRESET.md"
echo "RESULTS-ready: $DEST/RESULTS-$PRESET.md"
exit "$rc"
