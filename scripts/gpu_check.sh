#!/usr/bin/env bash
# The device check of longdoc on a machine with a CUDA GPU, meant to take under 8 minutes on one
# H100 or H200.
#
#   [WHEELS=DIR] [OUT=DIR] [DATA=DIR] [TOKENIZER=DIR] [JOBS=N] [STEPS="..."] scripts/gpu_check.sh
#
# WHEELS: a folder of wheels of what the machine lacks (the environment step names them), installed
# without an index or dependencies into SITE (default OUT/site-packages) with longdoc itself (from this checkout) and
# put on PYTHONPATH. DATA: the data samples (default ../shared/data); TOKENIZER: a folder of MiniLM's
# tokenizer files (default: the packaged MiniLM's). OUT (default gpu-check/) receives one Markdown
# table per step, each headed with the GPU's name, torch's and Triton's versions and the date:
#   environment.md  what the check needs, and its versions here (stops with exit 2 if any is missing
#                   or there is no CUDA GPU)
#   tests.md        tests/model/test_gpu_kernel.py and tests/model/backends on the GPU, the kernels
#                   compiled (TRITON_INTERPRET unset); pytest's own output in pytest.log
#   etc.md          the converted ETC fixtures on the GPU against CPU float32, float32 and bfloat16
#                   (weights, and autocast); transformers' BERT beside them where MiniLM is installed
#   tasks.md        every task's `longdoc train` (2 steps) and `longdoc predict --device cuda`, and
#                   `longdoc pretrain`; each command's output in tasks/*.log
#   softmax.md      one layer's two softmaxes at ETC-base sizes, gpu against eager backend: time and
#                   peak memory, forward and forward+backward, with and without residual attention
#                   and talking heads (docs/gpu/kernel.md: their kernels and what to expect)
#   attention.md    one layer's attention at 8192 and 16384 tokens (batch 1, ETC-base, bfloat16): the
#                   gpu and the eager backend against BERT's with SDPA, time and peak memory, and the
#                   kernels' score traffic per second
#   bench-minilm.md, bench-base.md
#                   `longdoc bench --plain --device cuda --dtype bfloat16` at 4096, 8192 and 16384
#                   against Longformer, BigBird and BERT (SDPA), MiniLM's and ETC-base's shapes, with
#                   the GPU targets' PASS / FAIL lines (scripts/bench_encoder.py)
#   hotpotqa.md     `longdoc train hotpotqa` at 4096 in ETC-base's shape against Longformer-base
# The first three run at once; the timed steps after them run alone. Each step has a time limit (a
# step that runs out of it fails and the others go on). The Python of the tables is
# scripts/gpu_check.py. JOBS: pytest's worker processes (default 8). STEPS: the steps to run (default
# tests etc tasks softmax attention bench hotpotqa; add tiles for the sweep of the kernels' tile
# sizes, tiles.md, which the default leaves out: it is for tuning them). The C++ CPU kernels are
# not built (LONGDOC_KERNELS=0): on CUDA the attention runs the GPU kernel.
set -euo pipefail
mkdir -p "${OUT:-gpu-check}"  # (OUT and WHEELS: relative to where the script is run from)
out=$(cd "${OUT:-gpu-check}" && pwd)
if [[ -n ${WHEELS:-} && ! -d $WHEELS ]]; then
    echo "gpu_check: WHEELS=$WHEELS: no such folder" >&2
    exit 2
fi
wheels=${WHEELS:+$(cd "$WHEELS" && pwd)}
for folder in "${DATA:-$(dirname "$0")/../../shared/data}" ${TOKENIZER:+"$TOKENIZER"}; do
    if [[ ! -d $folder ]]; then
        echo "gpu_check: $folder: no such folder (DATA: the data samples; TOKENIZER: MiniLM's tokenizer files)" >&2
        exit 2
    fi
done
data=$(cd "${DATA:-$(dirname "$0")/../../shared/data}" && pwd)
tokenizer=${TOKENIZER:+$(cd "$TOKENIZER" && pwd)}
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
site=${SITE:-$out/site-packages}
if [[ -n $wheels ]] && ! compgen -G "$wheels/*.whl" >/dev/null; then
    echo "gpu_check: WHEELS=$WHEELS: no .whl file there" >&2
    exit 2
fi
# longdoc from this checkout (tasks/ installs as longdoc.tasks), with the wheels, none of their dependencies
"$python" -m pip install --quiet --no-index --no-deps --no-build-isolation --upgrade --target "$site" \
    . ${wheels:+"$wheels"/*.whl}
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
# PYTHONSAFEPATH: `python -m longdoc.cli` run here must import the installed longdoc, not ./longdoc
export LONGDOC_KERNELS=0 TRANSFORMERS_VERBOSITY=error PYTHONSAFEPATH=1
unset TRITON_INTERPRET
gpu_check=("$python" scripts/gpu_check.py)
check() { "${gpu_check[@]}" "$@" --out "$out"; }

check environment

# Past this point a failing step does not stop the others; the exit status is the first failure's.
status=0
step() { "$@" || { local code=$?; ((status)) || status=$code; }; }
workers=()
if "$python" -c "import xdist" 2>/dev/null; then workers=(-n "${JOBS:-8}"); fi
limited() { local seconds=$1; shift; timeout --kill-after 10 "$seconds" "$@"; }
wanted() { [[ " ${STEPS:-tests etc tasks softmax attention bench hotpotqa} " == *" $1 "* ]]; }
samples=(--data "$data" ${tokenizer:+--tokenizer "$tokenizer"})
if wanted tests; then
    limited 120 "$python" -m pytest tests/model/test_gpu_kernel.py tests/model/backends -q "${workers[@]}" \
        -p no:cacheprovider --junitxml "$out/pytest.xml" >"$out/pytest.log" 2>&1 &
    tests=$!
fi
if wanted tasks; then
    limited 120 "${gpu_check[@]}" tasks "${samples[@]}" --out "$out" >"$out/tasks.out" 2>&1 &
    tasks=$!
fi
wanted etc && step limited 60 "${gpu_check[@]}" etc --out "$out"
if wanted tests; then
    step wait $tests
    tail -n 3 "$out/pytest.log"
    step check tests --junit "$out/pytest.xml"
fi
if wanted tasks; then
    step wait $tasks
    cat "$out/tasks.out"
fi

wanted softmax && step limited 60 "${gpu_check[@]}" softmax --repeats 5 --out "$out"
wanted attention && step limited 60 "${gpu_check[@]}" attention --repeats 5 --out "$out"
wanted tiles && step limited 150 "${gpu_check[@]}" tiles --repeats 5 --out "$out"
if wanted bench; then
    for shape in minilm base; do
        step limited $([[ $shape == base ]] && echo 120 || echo 90) "$python" scripts/bench_encoder.py --plain \
            --device cuda --dtype bfloat16 --lengths 4096,8192,16384 --repeats 2 --shape $shape \
            >"$out/bench-$shape.md" 2>"$out/bench-$shape.log"
        cat "$out/bench-$shape.md"
    done
fi
wanted hotpotqa && step limited 100 "${gpu_check[@]}" hotpotqa "${samples[@]}" --out "$out"

echo "tables in $out/"
exit "$status"
