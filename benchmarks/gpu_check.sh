#!/usr/bin/env bash
# The GPU proof in one short run: bench.py on CUDA, then the paper-base recipe on the shipped data
# under a clock, scored with beam 5 on both engines. Every leg has its own time limit and log, and a
# failing leg does not stop the next one.
#
#     bash benchmarks/gpu_check.sh [OUT_FOLDER] [TRAIN_MINUTES]
#
# Python packages the GPU machine lacks can be given as wheels in $WHEELS (a folder); they are
# installed into a folder of their own, never over the machine's packages.
set -u
out="${1:-${OUT:-gpu_check}}"
minutes="${2:-2}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=python3
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$out/steps.log"; }

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

step "bench.py --device cuda"
timeout 240 $python -m benchmarks.bench --device cuda --datasource "$data" --json >"$out/bench.json" 2>"$out/bench.log"
echo "exit $?" >>"$out/bench.log"

step "train.py, paper base, $minutes minutes"
work=$(mktemp -d)
timeout $((60 * minutes + 90)) $python train.py --datasource "$data" --max_minutes "$minutes" --device cuda \
    --experiment_name gpu_base --model_folder "$work/weights" --runs_folder "$work/runs" \
    --store_folder "$work/stores" --num_examples 0 >"$out/train.log" 2>&1
echo "exit $?" >>"$out/train.log"

step "export.py float16"
timeout 120 $python export.py --datasource "$data" --experiment_name gpu_base --model_folder "$work/weights" \
    --quantization float16 --output "$work/ct2" >"$out/export.log" 2>&1
echo "exit $?" >>"$out/export.log"
for engine in pytorch ctranslate2; do
    step "evaluate.py test beam 5 ($engine)"
    extra=()
    [ "$engine" = ctranslate2 ] && extra=(--engine ctranslate2 --model_dir "$work/ct2")
    start=$(date +%s.%N)
    timeout 60 $python evaluate.py --datasource "$data" --experiment_name gpu_base "${extra[@]}" \
        --model_folder "$work/weights" --store_folder "$work/stores" --split test --beam_size 5 --device cuda \
        --output "$out/test_hyp_$engine.txt" >"$out/eval_$engine.log" 2>&1
    echo "exit $? after $($python -c "import time; print(round(time.time() - $start, 1))") s" >>"$out/eval_$engine.log"
done
step "done"
