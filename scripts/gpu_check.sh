#!/usr/bin/env bash
# The device check of the GPU attention, on a machine with a CUDA GPU (meant to take under 8 minutes
# on one H100; not yet run on one).
#
#   [WHEELS=DIR] [OUT=DIR] [JOBS=N] scripts/gpu_check.sh
#
# WHEELS: a folder of wheels of what the machine lacks (the environment step names them), installed
# without an index or dependencies into OUT/site-packages and put on PYTHONPATH. longdoc itself runs
# from this checkout (PYTHONPATH), not installed. OUT (default gpu-check/) receives one Markdown
# table per step, each headed with the GPU's name, torch's and Triton's versions and the date:
#   environment.md  what the check needs, and its versions here (stops with exit 2 if any is missing
#                   or there is no CUDA GPU)
#   tests.md        tests/model/test_gpu_kernel.py and tests/model/backends on the GPU, the kernels
#                   compiled (TRITON_INTERPRET unset); pytest's own output in pytest.log
#   etc.md          the converted ETC fixtures on the GPU against CPU float32, float32 and bfloat16
#   softmax.md      one layer's two softmaxes at ETC-base sizes, gpu against eager backend: time and
#                   peak memory, forward and forward+backward
# The Python of each step is scripts/gpu_check.py. JOBS: pytest's worker processes (default 8).
set -euo pipefail
mkdir -p "${OUT:-gpu-check}"  # (OUT and WHEELS: relative to where the script is run from)
out=$(cd "${OUT:-gpu-check}" && pwd)
if [[ -n ${WHEELS:-} && ! -d $WHEELS ]]; then
    echo "gpu_check: WHEELS=$WHEELS: no such folder" >&2
    exit 2
fi
wheels=${WHEELS:+$(cd "$WHEELS" && pwd)}
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [[ -n $wheels ]]; then
    if ! compgen -G "$wheels/*.whl" >/dev/null; then
        echo "gpu_check: WHEELS=$WHEELS: no .whl file there" >&2
        exit 2
    fi
    "$python" -m pip install --quiet --no-index --no-deps --upgrade --target "$out/site-packages" "$wheels"/*.whl
    export PYTHONPATH="$out/site-packages${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
check() { "$python" scripts/gpu_check.py "$@" --out "$out"; }

check environment

# Past this point a failing step does not stop the others; the exit status is the first failure's.
status=0
step() { "$@" || { local code=$?; ((status)) || status=$code; }; }
workers=()
if "$python" -c "import xdist" 2>/dev/null; then workers=(-n "${JOBS:-8}"); fi
step "$python" -m pytest tests/model/test_gpu_kernel.py tests/model/backends -q "${workers[@]}" -p no:cacheprovider \
    --junitxml "$out/pytest.xml" >"$out/pytest.log" 2>&1
tail -n 3 "$out/pytest.log"
step check tests --junit "$out/pytest.xml"
step check etc
step check softmax
# (to come: `longdoc bench --device cuda` against Longformer, BigBird and BERT, and a training step of
# each task: scripts/gpu_check.py's PARTS)

echo "tables in $out/"
exit "$status"
