#!/usr/bin/env bash
# The GPU figures in one run of under 8 minutes on one GPU, offline (everything it reads is in the
# repository: data/tatoeba, benchmarks/news_lengths.json): bench_gpu.py (the training step on news
# lengths, paper base and big, the anchors' settings, tatoeba's launch-overhead check, against
# torch.nn.Transformer); then train.py on the GPU as a user runs it (the probe's batch, CUDA graphs
# over length buckets), and the CUDA paths the suite only rehearses: fp16 with its loss scaler,
# torchrun over NCCL. Every leg has its own time limit (their sum is 475 s) and log, and a failing
# leg does not stop the next. At the end: one table on stdout and one JSON, OUT_FOLDER/gpu_check.json.
#
#     bash benchmarks/gpu_check.sh [OUT_FOLDER]
#
# LEGS (default: all, in this order) names the legs to run: "bench train fp16 torchrun".
# DEVICE=cpu TINY=1 rehearses the script itself on a machine without a GPU (tiny sizes, seconds a leg).
# Python packages the GPU machine lacks can be given as wheels in $WHEELS (a folder); they are
# installed into a folder of their own, never over the machine's packages.
set -u
out="${1:-${OUT:-gpu_check}}"
legs=" ${LEGS:-bench train fp16 torchrun} "
device="${DEVICE:-cuda}"
tiny="${TINY:-}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$out/steps.log" >&2; }
wanted() { [[ "$legs" == *" $1 "* ]]; }
# leg NAME SECONDS COMMAND...: the command under its limit, its output in OUT/NAME.log, its exit code
# and seconds in OUT/NAME.exit
leg() {
    local name=$1 limit=$2 start
    shift 2
    step "$name (at most $limit s)"
    start=$(date +%s)
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "$? $(( $(date +%s) - start ))" >"$out/$name.exit"
}

step "machine"
{ nvidia-smi; nproc; $python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))"; } \
    >"$out/machine.txt" 2>&1
if [ -n "${WHEELS:-}" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    $python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl \
        >>"$out/machine.txt" 2>&1 && export PYTHONPATH=/tmp/site
fi
work=$(mktemp -d)
common=(--datasource data/tatoeba --device "$device" --model_folder "$work/weights" --runs_folder "$work/runs"
        --store_folder "$work/stores" --num_examples 0 --confidence_sentences 0 --val_max_sentences 64)
if [ -n "$tiny" ]; then
    bench=(--tiny --steps 2 --rows "base 32k" "tatoeba base 4,096" --variants captured eager nn.Transformer)
    base=(--preset tiny --batch_tokens auto --max_steps 20) short=(--preset tiny) steps=(20 10)
else
    bench=(--budget_s 230) base=(--max_minutes 0.75) short=(--preset cpu) steps=(100 60)
fi

wanted bench && leg bench 290 $python -m benchmarks.bench_gpu --device "$device" --json "$out/bench_gpu.json" "${bench[@]}"
# The paper-base recipe on tatoeba as a user runs it on a GPU: --batch_tokens auto (the probe),
# --update_tokens 25,000, --cuda_graphs auto.
wanted train && leg train 90 $python train.py "${common[@]}" "${base[@]}" --experiment_name gpu_train
wanted fp16 && leg fp16 45 $python train.py "${common[@]}" "${short[@]}" --amp fp16 --max_steps "${steps[0]}" \
    --experiment_name gpu_fp16
wanted torchrun && leg torchrun 45 $python -m torch.distributed.run --standalone --nproc_per_node 1 train.py \
    "${common[@]}" "${short[@]}" --max_steps "${steps[1]}" --experiment_name gpu_torchrun

step "summary"
$python - "$out" "$work" <<'EOF'
"""One table and one JSON (OUT/gpu_check.json) from the legs' outputs."""
import json, os, statistics, sys
from pathlib import Path
out, work = Path(sys.argv[1]), Path(sys.argv[2])

def run_of(name):
    """A train.py leg: its exit, seconds, TensorBoard scalars and the decisions it recorded."""
    exit_file = out / f"{name}.exit"
    if not exit_file.exists():
        return None
    code, seconds = map(int, exit_file.read_text().split())
    leg = {"exit": code, "seconds": seconds, "log_tail": (out / f"{name}.log").read_text()[-600:]}
    runs = work / "runs" / f"gpu_{name}"
    if runs.is_dir():
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        events = EventAccumulator(str(runs)); events.Reload()
        values = lambda tag: [s.value for s in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []
        loss, speed = values("train/loss"), values("train/tokens_per_second")
        leg.update(steps=events.Scalars("train/loss")[-1].step if loss else 0, loss=[loss[0], loss[-1]] if loss else [],
                   tokens_per_s=statistics.median(speed[len(speed) // 2:]) if speed else None,
                   skipped=sum(values("train/skipped_steps")), loss_scale=(values("train/loss_scale") or [None])[-1])
    record = work / "weights" / f"gpu_{name}" / "config.json"
    if record.exists():
        leg["decided"] = json.loads(record.read_text())["decided"]
    return leg

result = {"machine": (out / "machine.txt").read_text() if (out / "machine.txt").exists() else "",
          "legs": {name: run_of(name) for name in ("bench", "train", "fp16", "torchrun")}}
if (out / "bench_gpu.json").exists():
    result["bench_gpu"] = json.loads((out / "bench_gpu.json").read_text())
(out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
if "bench_gpu" in result:
    from benchmarks.bench_gpu import table
    print(table(result["bench_gpu"]))
else:
    print(f"bench leg: no figures (see {out / 'bench.log'})")
print(f"\n{'leg':<10}{'exit':>5}{'s':>5}{'steps':>7}{'loss':>16}{'tokens/s':>11}  decided / notes")
for name, leg in result["legs"].items():
    if leg is None:
        continue
    loss = " -> ".join(f"{value:.2f}" for value in leg.get("loss", [])) or "-"
    decided = ", ".join(f"{key} {entry['value']}" for key, entry in leg.get("decided", {}).items()
                        if key in ("batch_tokens", "accum_steps", "cuda_graphs"))
    notes = decided + (f"; skipped {leg['skipped']:.0f}, loss scale {leg['loss_scale']}" if leg.get("loss_scale") else "")
    speed = f"{leg['tokens_per_s']:,.0f}" if leg.get("tokens_per_s") else "-"
    print(f"{name:<10}{leg['exit']:>5}{leg['seconds']:>5}{leg.get('steps', '-'):>7}{loss:>16}{speed:>11}  {notes}")
print(f"\n(all figures: {out / 'gpu_check.json'})")
EOF
rm -rf "$work"
step "done"
