#!/usr/bin/env bash
# The GPU proof in one short run: bench.py on CUDA; bench_new_shapes.py (a batch shape's first
# step against the same step again, cuDNN's attention off and on); the paper-base recipe on the
# shipped data, planned to a clock and scored with beam 5 on both engines; then the CUDA paths the
# suite only rehearses: fp16 with its loss scaler, torchrun over NCCL, and --compile (inductor) to a
# run's end. Every leg has its own time limit and log, and a failing leg does not stop the next one.
#
#     bash benchmarks/gpu_check.sh [OUT_FOLDER] [TRAIN_MINUTES]
#
# LEGS (default: all, in this order) names the legs to run: "bench shapes train eval fp16 torchrun compile".
# DEVICE (default cuda) lets the script itself be rehearsed on a machine without a GPU.
# Python packages the GPU machine lacks can be given as wheels in $WHEELS (a folder); they are
# installed into a folder of their own, never over the machine's packages.
set -u
out="${1:-${OUT:-gpu_check}}"
minutes="${2:-2}"
legs=" ${LEGS:-bench shapes train eval fp16 torchrun compile} "
device="${DEVICE:-cuda}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=python3
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$out/steps.log"; }
wanted() { [[ "$legs" == *" $1 "* ]]; }

# A run's TensorBoard scalars in one line: steps, loss first and last, the median tokens/s of the
# second half of the run, skipped steps, the last fp16 loss scale.
summary() {
    $python - "$1" <<'EOF'
import os, statistics, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
if not os.path.isdir(sys.argv[1]):
    sys.exit(f"{sys.argv[1]}: no TensorBoard run (the leg failed before its first step)")
events = EventAccumulator(sys.argv[1]); events.Reload()
values = lambda tag: [s.value for s in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []
loss, speed = values("train/loss"), values("train/tokens_per_second")
steps = events.Scalars("train/loss")[-1].step if loss else 0
print(f"{sys.argv[1]}: {steps} steps, loss {loss[0] if loss else 0:.3f} -> {loss[-1] if loss else 0:.3f}, "
      f"{statistics.median(speed[len(speed) // 2:]) if speed else 0:,.0f} tokens/s (median, second half), "
      f"skipped {sum(values('train/skipped_steps')):.0f}, loss scale {(values('train/loss_scale') or ['-'])[-1]}")
EOF
}

step "machine"
{ nvidia-smi; nproc; $python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"; } \
    >"$out/machine.txt" 2>&1
if [ -n "${WHEELS:-}" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    $python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl \
        >>"$out/machine.txt" 2>&1 && export PYTHONPATH=/tmp/site
fi
data=data/tatoeba
$python -c "import datasets" 2>>"$out/machine.txt" || data="${TSV_DATA:-$data}"
echo "data: $data" >>"$out/machine.txt"
work=$(mktemp -d)
paths=(--datasource "$data" --model_folder "$work/weights")
common=("${paths[@]}" --device "$device" --runs_folder "$work/runs" --store_folder "$work/stores" --num_examples 0)

if wanted bench; then
    step "bench.py --device $device"
    timeout 240 $python -m benchmarks.bench --device "$device" --datasource "$data" --json >"$out/bench.json" \
        2>"$out/bench.log"
    echo "exit $?" >>"$out/bench.log"
fi

if wanted shapes; then
    step "bench_new_shapes.py --device $device"
    timeout 180 $python -m benchmarks.bench_new_shapes --device "$device" --datasource "$data" >"$out/shapes.txt" \
        2>"$out/shapes.log"
    echo "exit $?" >>"$out/shapes.log"
fi

if wanted train; then
    step "train.py, paper base, $minutes minutes"
    limit=$($python -c "print(round(60 * $minutes) + 90)")
    timeout "$limit" $python train.py "${common[@]}" --max_minutes "$minutes" --experiment_name gpu_base \
        >"$out/train.log" 2>&1
    echo "exit $?" >>"$out/train.log"
    summary "$work/runs/gpu_base" >>"$out/train.log" 2>&1
fi

if wanted eval; then
    step "export.py float16"
    timeout 60 $python export.py "${paths[@]}" --experiment_name gpu_base --quantization float16 \
        --output "$work/ct2" >"$out/export.log" 2>&1
    echo "exit $?" >>"$out/export.log"
    # CTranslate2's CUDA build loads libcublas.so.12, which a CUDA 13 machine may have somewhere.
    cublas=$(find /usr /opt -name 'libcublas.so.12' 2>/dev/null | head -1)
    echo "libcublas.so.12: ${cublas:-none found under /usr and /opt}" >>"$out/export.log"
    for engine in pytorch ctranslate2; do
        step "evaluate.py test beam 5 ($engine)"
        extra=()
        [ "$engine" = ctranslate2 ] && extra=(--engine ctranslate2 --model_dir "$work/ct2")
        start=$(date +%s.%N)
        LD_LIBRARY_PATH="${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}" timeout 60 $python evaluate.py \
            "${paths[@]}" --device "$device" --store_folder "$work/stores" --experiment_name gpu_base \
            "${extra[@]}" --split test --beam_size 5 --output "$out/test_hyp_$engine.txt" >"$out/eval_$engine.log" 2>&1
        echo "exit $? after $($python -c "import time; print(round(time.time() - $start, 1))") s" >>"$out/eval_$engine.log"
    done
fi

# The short legs: the cpu preset (tatoeba's recipe) for a few hundred steps, a small validation.
short=("${common[@]}" --preset cpu --val_max_sentences 64 --confidence_sentences 0)
if wanted fp16; then
    step "train.py --amp fp16 (loss-scaled), 300 steps"
    timeout 90 $python train.py "${short[@]}" --amp fp16 --max_steps 300 --experiment_name gpu_fp16 \
        >"$out/fp16.log" 2>&1
    echo "exit $?" >>"$out/fp16.log"
    summary "$work/runs/gpu_fp16" >>"$out/fp16.log" 2>&1
fi
if wanted torchrun; then
    step "torchrun --nproc_per_node 1 (NCCL), 150 steps"
    timeout 90 $python -m torch.distributed.run --standalone --nproc_per_node 1 train.py "${short[@]}" \
        --max_steps 150 --experiment_name gpu_torchrun >"$out/torchrun.log" 2>&1
    echo "exit $?" >>"$out/torchrun.log"
    summary "$work/runs/gpu_torchrun" >>"$out/torchrun.log" 2>&1
fi
if wanted compile; then
    # The cpu preset, so that the run reaches its end inside the check; TORCH_LOGS names each recompilation.
    step "train.py --compile true (inductor), cpu preset, 300 steps"
    TORCH_LOGS=recompiles timeout 240 $python train.py "${short[@]}" --compile true --max_steps 300 \
        --experiment_name gpu_compile >"$out/compile.log" 2>&1
    echo "exit $?" >>"$out/compile.log"
    echo "recompilations logged: $(grep -c 'Recompiling function' "$out/compile.log")" >>"$out/compile.log"
    summary "$work/runs/gpu_compile" >>"$out/compile.log" 2>&1
fi
step "done"
