#!/usr/bin/env bash
# One command, on any machine with a GPU: the WGSL engines against burn's wgpu path and the
# fused CPU steps, on lecture17, scaled and transformer-sort; then the transformer's sweep (D,
# layers, B·G, max_len: WGSL, burn, fused) and the B·G / n / D scaling sweep on the GPU and on
# the CPU; and the fused CPU engines' threads curve (1 … every core). Prints one table (and
# writes the sweeps under bench-gpu-out/).
#
#   bench/gpu.sh                 # a hardware GPU (--device gpu)
#   DEVICE=software bench/gpu.sh # lavapipe, for comparison on a machine without one
#   ITER=5 SWEEP=0 bench/gpu.sh  # fewer timed iterations, no sweep
#   BIN=/path/grpo-lab bench/gpu.sh  # a release binary built elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE="${DEVICE:-gpu}"
ITER="${ITER:-10}"
SWEEP="${SWEEP:-1}"
OUT="${OUT:-bench-gpu-out}"
# BIN=path/to/grpo-lab uses a binary built elsewhere (a machine without a toolchain).
if [ -z "${BIN:-}" ]; then
  cargo build --release --bin grpo-lab >&2
  BIN=target/release/grpo-lab
fi
mkdir -p "$OUT"
$BIN devices >&2 || true
row() { # preset device extra-args...
  local preset=$1 device=$2; shift 2
  local err="$OUT/$preset-$device.err"
  # A failed bench (no such device, a bad flag) ends the script naming why.
  if ! $BIN bench --preset "$preset" --device "$device" --iterations "$ITER" --json "$@" 2>"$err" | tail -1; then
    echo "bench/gpu.sh: grpo-lab bench --preset $preset --device $device failed:" >&2
    tail -n 3 "$err" >&2
    [ "$device" = gpu ] && echo "(lavapipe on a machine without a GPU: DEVICE=software bench/gpu.sh)" >&2
    exit 2
  fi
}
printf '%-10s %-44s %12s %12s %10s %12s %12s %14s %12s %7s\n' preset engine ms/step burn_ms/step speedup dispatches subs/iter first_step_ms first_vs_burn steal%
show() { # json-file preset
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
f = lambda k, fmt: (fmt % r[k]) if r.get(k) is not None else "-"
# steal%: the hypervisor's share of the machine while the steps were timed (a VM's neighbours).
steal = (r.get("host_load") or {}).get("timed") or {}
print("%-10s %-44s %12s %12s %10s %12s %12s %14s %12s %7s" % (
    sys.argv[2], (r["engine"] + " / " + r["device"])[:44], f("ms_per_step", "%.4f"),
    f("burn_ms_per_step", "%.3f"), f("speedup_vs_burn", "%.1fx"),
    f("dispatches_per_step", "%d"), f("submissions_per_iteration", "%.1f"),
    f("first_step_ms", "%.1f"), f("first_step_speedup_vs_burn", "%.1fx"),
    ("%.1f" % (100 * steal["steal_share"])) if "steal_share" in steal else "-"))
PY
}
for preset in lecture17 scaled; do
  for dev in "$DEVICE" cpu; do
    extra=()
    [ "$dev" != cpu ] && extra=(--vs-burn)
    row "$preset" "$dev" "${extra[@]}" > "$OUT/$preset-$dev.json"
    show "$OUT/$preset-$dev.json" "$preset"
  done
done
# The transformer: its WGSL engine (run.engine = wgsl) against burn's path on the same device,
# and the fused CPU engine on one thread (no dynamic sampling: every iteration the same work).
T_ITER="${T_ITER:-3}"
ITER="$T_ITER" row transformer-sort "$DEVICE" --set run.engine=wgsl \
  --set algorithm.dynamic_sampling=false --vs-burn > "$OUT/transformer-sort-$DEVICE.json"
show "$OUT/transformer-sort-$DEVICE.json" transformer
ITER="$T_ITER" row transformer-sort cpu --threads 1 \
  --set algorithm.dynamic_sampling=false > "$OUT/transformer-sort-cpu.json"
show "$OUT/transformer-sort-cpu.json" transformer
if [ "$SWEEP" = 1 ]; then
  # The transformer's sweep on the device: the WGSL engine and burn's path there, the fused
  # engine on the CPU (D, layers, B·G, max_len; one timed iteration a point).
  echo "transformer scaling sweep on $DEVICE (WGSL engine, burn's path; the fused engine on the CPU):"
  $BIN bench --preset transformer-sort --device "$DEVICE" --iterations 1 \
    --scaling "$OUT/scaling-transformer-$DEVICE" 2>/dev/null
  for dev in "$DEVICE" cpu; do
    echo "scaling sweep on $dev (around scaled; B·G up to 65 536, D up to 256):"
    $BIN bench --preset scaled --device "$dev" --iterations 2 --scaling "$OUT/scaling-$dev" 2>/dev/null
  done
  python3 - "$OUT/scaling-$DEVICE/scaling.csv" "$OUT/scaling-cpu/scaling.csv" "$DEVICE" <<'PY'
import csv, sys
gpu = {(r["axis"], r["size"]): float(r["ms_per_step"]) for r in csv.DictReader(open(sys.argv[1]))}
cpu = {(r["axis"], r["size"]): float(r["ms_per_step"]) for r in csv.DictReader(open(sys.argv[2]))}
print("%-5s %8s %14s %14s %10s" % ("axis", "size", sys.argv[3] + " ms", "cpu ms", "cpu/" + sys.argv[3]))
for k in gpu:
    if k in cpu:
        print("%-5s %8s %14.3f %14.3f %10.2f" % (k[0], k[1], gpu[k], cpu[k], cpu[k] / gpu[k]))
PY
fi
# The fused CPU engines on 1, 2, 4 … every core, their iterations timed in turn (`--scaling DIR
# --axes threads`: one trainer per thread count; any count gives the same bits).
echo "threads (fused CPU engine, --device cpu, timed in turn; speed-up against one thread):"
printf '%-17s %8s %12s %9s\n' preset threads ms/step speedup
for preset in transformer-sort scaled; do
  $BIN bench --preset "$preset" --device cpu --iterations "$ITER" \
    --set algorithm.dynamic_sampling=false --scaling "$OUT/threads-$preset" --axes threads \
    >/dev/null 2>&1
  python3 - "$OUT/threads-$preset/scaling.csv" "$preset" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))[1:]
# (threads, wall ms per step): the value after "threads", the wall time before the slope.
pts = [(int(r[r.index("threads") + 1]), float(r[-2])) for r in rows if "threads" in r]
for n, ms in pts:
    print("%-17s %8d %12.3f %8.2fx" % (sys.argv[2], n, ms, pts[0][1] / ms))
PY
done
