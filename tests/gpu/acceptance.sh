#!/usr/bin/env bash
# GPU acceptance: one command, from a clean checkout on a one-GPU machine, gives the evidence that fsdpc's
# CUDA kernels, NCCL backend and training on the GPU work (docs/kernels_cuda.md, "Acceptance on a GPU").
#
#   tests/gpu/acceptance.sh [--dry-run] [--build DIR] [--out DIR] [--stages LIST] [--batch B]
#                           [--peak-tflops-bf16 X --peak-tflops-tf32 Y] [--fail STAGE]
#
# Stages, in order (--stages picks some, comma-separated), each bounded to 570 s (machines lent for GPU
# work allow 10 minutes per command, so each stage can also be run on its own with --stages):
#   env      GPU, driver, CUDA and NCCL versions; fails when the driver cannot run this CUDA build; installs
#            the Debian packages of .ci/run only where missing
#   build    meson -Dcuda=enabled -Dgpu_arch=<the GPU's compute capability>, only the targets used here;
#            checks the module carries code this GPU runs
#   kernels  every test of the 'gpu' suite (CUDA kernels against the CPU backend), a skip counting as a
#            failure; compute-sanitizer memcheck and racecheck where installed
#   nccl     the NCCL tests at world 1; world 2 on one GPU must fail fast naming the duplicate GPU (NCCL 2.28)
#            or, where NCCL allows two ranks per GPU, run (the tests check exact results); on 2+ GPUs it runs
#   train    device = cuda for 20 steps against the CPU run of the same config, per-step losses within the
#            documented bounds for fp32, TF32, bf16, fp16, offload and activation checkpointing; a GPU
#            checkpoint resumed on the GPU (exact) and on the CPU, and a CPU checkpoint resumed on the GPU
#   bench    GPT-2 124M (12 x 768, T = 1024) in bf16 and TF32: tokens/s, ms/step, peak memory and MFU by
#            llm.c's formula, beside llm.c's published figures
# OUT/summary.txt gets one `PASS stage: detail` or `FAIL stage: detail` line per stage, OUT/<stage>.log the
# stage's output; the exit code is the number of FAIL lines.
#
# --dry-run proves the plumbing without a GPU (CI runs it): the same stages and checks with the CPU standing
# in for the GPU and smaller runs, an existing build (--build, nothing is compiled), and skips of GPU tests
# expected. --fail STAGE (dry runs only) makes that stage fail, to check the counting.
set -u

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
dry=0
build=""
out=""
stages="env,build,kernels,nccl,train,bench"
fail_stage=""
only=""
batch=8
peak_bf16=""
peak_tf32=""
stage_limit=570

usage() { sed -n '4,8p' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --build) build=$2; shift ;;
    --out) out=$2; shift ;;
    --stages) stages=$2; shift ;;
    --fail) fail_stage=$2; shift ;;
    --batch) batch=$2; shift ;;
    --peak-tflops-bf16) peak_bf16=$2; shift ;;
    --peak-tflops-tf32) peak_tf32=$2; shift ;;
    --stage-only) only=$2; shift ;; # internal: run one stage in this process
    -h|--help) usage ;;
    *) echo "acceptance: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
if [ -n "$fail_stage" ] && [ "$dry" = 0 ]; then
  echo "acceptance: --fail is for dry runs only" >&2
  exit 2
fi
build=${build:-$src/build-gpu}
out=${out:-$src/acceptance-out}
case "$build" in /*) ;; *) build=$(pwd)/$build ;; esac
case "$out" in /*) ;; *) out=$(pwd)/$out ;; esac
export PATH="$PATH:/usr/local/cuda/bin"
tools="python3 $here/acceptance_tools.py"
worker="$build/worker/fsdp-worker"

# ---- helpers -------------------------------------------------------------------------------------------

note() { printf '%s\n' "$*" > "$out/$only.note"; echo "note: $*"; }
facts() { [ -f "$out/env.txt" ] && . "$out/env.txt"; cc=${cc:-90}; ndev=${ndev:-1}; gpu_name=${gpu_name:-}; }

# The Debian packages .ci/run installs (one list for both).
ci_packages() { sed -n '/^PKGS="/,/"$/p' "$src/.ci/run" | sed 's/^PKGS="//; s/"$//' | tr -s ' \n' ' '; }

# The Criterion [SKIP] lines of the meson test run just finished, minus those whose reason matches $1.
skips_of_last_run() {
  local allow=${1:-}
  grep -h '^\[SKIP\]' "$build/meson-logs/testlog.txt" 2>/dev/null | sort -u |
    { if [ -n "$allow" ]; then grep -v -- "$allow"; else cat; fi; } || true
}

# ---- stages --------------------------------------------------------------------------------------------

stage_env() {
  local nvcc_ver nccl_ver missing
  nvcc_ver=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
  nccl_ver=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v=v (v?".":"") $3} END{print v}' \
             /usr/local/cuda/include/nccl.h 2>/dev/null)
  echo "nvcc: ${nvcc_ver:-not found}; NCCL (header): ${nccl_ver:-not found}"
  missing=""
  for p in $(ci_packages); do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    echo "missing Debian packages:$missing"
    if [ "$dry" = 1 ]; then
      echo "dry run: not installing"
    elif [ "$(id -u)" = 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing ||
        { note "cannot install$missing (no network? install them first)"; return 1; }
    else
      note "missing packages$missing and not root"; return 1
    fi
  fi
  if [ "$dry" = 1 ]; then
    { echo "cc=90"; echo "ndev=1"; echo "gpu_name='dry run'"; } > "$out/env.txt"
    note "dry run: nvcc ${nvcc_ver:-none}, NCCL ${nccl_ver:-none}, packages listed from .ci/run"
    return 0
  fi
  if ! command -v nvidia-smi >/dev/null; then
    note "no nvidia-smi: no NVIDIA driver on this machine"; return 1
  fi
  local q
  q=$(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>&1) ||
    { note "nvidia-smi failed: $q"; return 1; }
  echo "GPUs:"; echo "$q"
  local name drv cap mem n drv_cuda
  IFS=, read -r name drv cap mem <<< "$(echo "$q" | head -1)"
  name=$(echo "$name" | xargs); drv=$(echo "$drv" | xargs); cap=$(echo "$cap" | xargs); mem=$(echo "$mem" | xargs)
  n=$(echo "$q" | grep -c .)
  drv_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -1)
  { echo "cc=${cap/./}"; echo "ndev=$n"; echo "gpu_name='$name'"; echo "driver='$drv'"; echo "driver_cuda='$drv_cuda'"
    echo "nvcc='$nvcc_ver'"; echo "nccl='$nccl_ver'"; } > "$out/env.txt"
  echo "driver $drv (runs CUDA ${drv_cuda:-?} at most), CUDA toolkit $nvcc_ver, NCCL $nccl_ver, compute capability $cap"
  if [ -z "$nvcc_ver" ]; then note "nvcc not found under /usr/local/cuda/bin"; return 1; fi
  if [ -n "$drv_cuda" ] && [ "${drv_cuda%%.*}" -lt "${nvcc_ver%%.*}" ]; then
    note "driver $drv runs CUDA $drv_cuda at most but this build is CUDA $nvcc_ver (CUDA 13 needs R580 or newer): cudaGetDeviceCount would fail with error 35; update the driver"
    return 1
  fi
  if command -v compute-sanitizer >/dev/null; then echo "compute-sanitizer: $(command -v compute-sanitizer)"; fi
  note "$n x $name ($mem, sm_${cap/./}), driver $drv (CUDA $drv_cuda), CUDA $nvcc_ver, NCCL $nccl_ver"
}

targets="worker/fsdp-worker worker/fsdp-prepare-data launcher/fsdp-launch gpu/libfsdp_gpu.so
  tests/kernels/test_kernels_ops tests/kernels/test_kernels_attention tests/kernels/test_kernels_crossentropy_adamw
  tests/kernels/test_kernels_cast tests/kernels/test_kernels_cuda tests/kernels/test_gpu_module
  tests/common/test_dtype tests/comm/test_comm_nccl"

stage_build() {
  facts
  if [ "$dry" = 1 ]; then
    [ -f "$build/build.ninja" ] || { note "dry run needs an existing build (--build DIR)"; return 1; }
    local all missing=""
    all=$(ninja -C "$build" -t targets all 2>/dev/null | cut -d: -f1)
    for t in $targets; do echo "$all" | grep -qx "$t" || missing="$missing $t"; done
    if [ -f "$build/gpu/libfsdp_gpu.so" ]; then
      # the module of a CUDA build: PTX must let a newer GPU (Blackwell, 10.0) JIT the kernels
      python3 "$here/fatbin_arches.py" "$build/gpu/libfsdp_gpu.so" --runs-on 100 ||
        { note "the GPU module carries no code a compute capability 10.0 GPU can run"; return 1; }
      [ -z "$missing" ] || { note "targets missing from the build:$missing"; return 1; }
      note "dry run: every target exists; the module's GPU code runs on sm_90 and (PTX) newer"
    else
      note "dry run: no GPU module in this build (built without CUDA); targets other than it:${missing:- all present}"
    fi
    return 0
  fi
  local arch=$cc
  if [ -f "$build/build.ninja" ]; then
    meson configure "$build" -Dcuda=enabled -Dgpu_arch="$arch" || { note "meson configure failed"; return 1; }
  else
    meson setup "$build" "$src" -Dcuda=enabled -Dgpu_arch="$arch" -Dbuildtype=release ||
      { note "meson setup failed (see build.log)"; return 1; }
  fi
  # shellcheck disable=SC2086
  ninja -C "$build" -j "$(nproc)" $targets || { note "ninja failed"; return 1; }
  python3 "$here/fatbin_arches.py" "$build/gpu/libfsdp_gpu.so" --sm "$arch" --runs-on "$arch" ||
    { note "the module lacks code for sm_$arch"; return 1; }
  note "built for sm_$arch (+ PTX) in $build"
}

stage_kernels() {
  facts
  local rc=0 skips n
  meson test -C "$build" --no-rebuild --suite gpu --num-processes 2 --print-errorlogs || rc=1
  skips=$(skips_of_last_run)
  n=$(printf '%s' "$skips" | grep -c . || true)
  [ -n "$skips" ] && { echo "skipped:"; echo "$skips"; }
  if [ "$dry" = 1 ]; then
    [ "$rc" = 0 ] || { note "the gpu suite failed without a GPU"; return 1; }
    note "dry run: gpu suite ran, $n skip(s) (each a failure on a GPU machine)"
    return 0
  fi
  [ "$n" = 0 ] || { note "$n GPU test(s) skipped: a skip here is a failure"; rc=1; }
  local san
  san=$(command -v compute-sanitizer || true)
  if [ -n "$san" ]; then
    for tool in memcheck racecheck; do
      local exe=$build/tests/kernels/test_kernels_cuda
      [ "$tool" = racecheck ] && exe=$build/tests/kernels/test_kernels_attention
      echo "== compute-sanitizer --tool $tool $exe"
      FSDP_KERNELS_BACKEND=cuda CRITERION_VERBOSITY_LEVEL=1 timeout 240 "$san" --tool "$tool" --error-exitcode 99 \
        --target-processes all "$exe" -j1 || { echo "compute-sanitizer $tool failed"; rc=1; }
    done
    # context-parallel attention's shared tiles (test_kernels_attention's CP cases need host memory: skipped)
    echo "== compute-sanitizer --tool racecheck test_kernels_cuda --filter 'kernels_cuda/attention_cp*'"
    CRITERION_VERBOSITY_LEVEL=1 timeout 240 "$san" --tool racecheck --error-exitcode 99 --target-processes all \
      "$build/tests/kernels/test_kernels_cuda" -j1 --filter 'kernels_cuda/attention_cp*' ||
      { echo "compute-sanitizer racecheck (attention_cp) failed"; rc=1; }
  else
    echo "compute-sanitizer not installed: memcheck/racecheck not run"
  fi
  if [ "$rc" = 0 ]; then
    note "gpu suite passed with no skip${san:+; compute-sanitizer memcheck and racecheck clean}"
  elif [ ! -f "$out/kernels.note" ]; then
    note "gpu suite failed (see kernels.log)"
  fi
  return $rc
}

stage_nccl() {
  facts
  local rc=0 skips
  echo "== world 1"
  FSDP_TEST_NCCL_WORLD=1 meson test -C "$build" --no-rebuild comm_nccl --print-errorlogs || rc=1
  skips=$(skips_of_last_run "needs 2 or more ranks")
  if [ -n "$skips" ] && [ "$dry" = 0 ]; then echo "skipped:"; echo "$skips"; rc=1; fi
  [ "$rc" = 0 ] || { note "the NCCL tests failed at world 1"; return 1; }
  echo "== world 2 on $ndev GPU(s)"
  local t0 t1 code log=$out/nccl-world2.log
  t0=$(date +%s)
  if [ "$ndev" -ge 2 ]; then
    FSDP_TEST_NCCL_WORLD=2 meson test -C "$build" --no-rebuild comm_nccl --print-errorlogs > "$log" 2>&1
    code=$?
  else
    # one GPU: NCCL 2.28 refuses ("Duplicate GPU detected"); NCCL 2.30 runs it with this variable
    FSDP_TEST_NCCL_WORLD=2 NCCL_MULTI_RANK_GPU_ENABLE=1 CRITERION_VERBOSITY_LEVEL=1 timeout 180 \
      "$build/tests/comm/test_comm_nccl" --filter='comm_nccl/collectives_on_gpus' > "$log" 2>&1
    code=$?
  fi
  t1=$(date +%s)
  cat "$log"
  if [ "$dry" = 1 ]; then
    [ "$code" = 0 ] || { note "dry run: the NCCL test binary failed without a GPU (exit $code)"; return 1; }
    note "dry run: world 1 and world 2 ran their plumbing (the NCCL tests skip without a GPU)"
  elif [ "$code" = 0 ]; then
    note "world 1 passed; world 2 on $ndev GPU(s) ran and gave the exact results in $((t1 - t0)) s"
  elif grep -qi 'duplicate gpu' "$log" && [ $((t1 - t0)) -le 120 ]; then
    note "world 1 passed; world 2 on one GPU refused in $((t1 - t0)) s naming the duplicate GPU (this NCCL allows one rank per GPU)"
  else
    note "world 2 on $ndev GPU(s) neither ran nor failed naming the duplicate GPU (exit $code, $((t1 - t0)) s)"
    rc=1
  fi
  return $rc
}

# Loss bounds of the train stage: the largest relative difference allowed at any of the 20 steps between a
# GPU run and the CPU run of the same config (docs/kernels_cuda.md says why each is what it is).
bound_fp32=1e-4
bound_tf32=5e-3
bound_bf16=3e-2
bound_fp16=3e-2

stage_train() {
  facts
  local dir=$out/train steps=20 every=10 gpu=cuda rc=0 C=128 T=64
  # dry: the CPU stands in for the GPU, on one thread (CI machines are small and shared), a smaller model
  if [ "$dry" = 1 ]; then steps=6; every=3; gpu=cpu; C=32; T=32; export OMP_NUM_THREADS=1; fi
  rm -rf "$dir"; mkdir -p "$dir"
  "$build/worker/fsdp-prepare-data" -o "$dir/data" "$src/tests/data/corpus" > "$dir/prepare.log" 2>&1 ||
    { cat "$dir/prepare.log"; note "fsdp-prepare-data failed"; return 1; }
  cat > "$dir/train.ini" <<EOF
[model]
n_layer = 2
n_head = 4
n_embd = $C
vocab_size = 256
block_size = $T
[train]
train_batch = 8
micro_batch = 4
max_steps = $steps
eval_interval = 0
[optim]
lr = 0.001
warmup_steps = 2
[data]
train_file = $dir/data/train.bin
[log]
interval = 1
[checkpoint]
interval = -1
EOF
  # run NAME DEVICE [ENV=VALUE...] -- [--key=value...]
  run() {
    local name=$1 dev=$2; shift 2
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    echo "== $name: device $dev ${envs[*]:-} $*"
    env FSDP_CUDA_TF32=0 "${envs[@]}" timeout 240 "$worker" "$dir/train.ini" --train.device="$dev" \
      --log.dir="$dir/$name/log" --checkpoint.dir="$dir/$name/ckpt" "$@" > "$dir/$name.out" 2>&1 ||
      { tail -5 "$dir/$name.out"; echo "run $name failed"; return 1; }
  }
  cmp() { $tools compare "$dir/$1/log/metrics.jsonl" "$dir/$2/log/metrics.jsonl" --name "$1-vs-$2" "${@:3}"; }
  local ck="--checkpoint.interval=$every"
  run cpu32 cpu -- --fsdp.mixed_precision=fp32 "$ck" || rc=1
  run cpubf16 cpu -- --fsdp.mixed_precision=bf16 || rc=1
  run cpufp16 cpu -- --fsdp.mixed_precision=fp16 || rc=1
  run gpu32 "$gpu" -- --fsdp.mixed_precision=fp32 "$ck" || rc=1
  run gputf32 "$gpu" FSDP_CUDA_TF32=1 -- --fsdp.mixed_precision=fp32 || rc=1
  run gpubf16 "$gpu" -- --fsdp.mixed_precision=bf16 || rc=1
  run gpufp16 "$gpu" -- --fsdp.mixed_precision=fp16 || rc=1
  run gpuoffload "$gpu" -- --fsdp.mixed_precision=fp32 --fsdp.offload_params=true || rc=1
  run gpuactckpt "$gpu" -- --fsdp.mixed_precision=fp32 --model.activation_checkpointing=true || rc=1
  local from_gpu=$dir/gpu32/ckpt/fsdp_sharded_cpt$every from_cpu=$dir/cpu32/ckpt/fsdp_sharded_cpt$every
  run gpu_resumes_gpu "$gpu" -- --fsdp.mixed_precision=fp32 --checkpoint.resume_from="$from_gpu" || rc=1
  run cpu_resumes_gpu cpu -- --fsdp.mixed_precision=fp32 --checkpoint.resume_from="$from_gpu" || rc=1
  run gpu_resumes_cpu "$gpu" -- --fsdp.mixed_precision=fp32 --checkpoint.resume_from="$from_cpu" || rc=1
  [ "$rc" = 0 ] || { note "a training run failed (see train.log)"; return 1; }
  local bad=0 lines
  lines=$(
    cmp gpu32 cpu32 --bound $bound_fp32 || echo FAILED
    cmp gputf32 cpu32 --bound $bound_tf32 || echo FAILED
    cmp gpubf16 cpubf16 --bound $bound_bf16 || echo FAILED
    cmp gpufp16 cpufp16 --bound $bound_fp16 || echo FAILED
    cmp gpuoffload cpu32 --bound $bound_fp32 || echo FAILED
    cmp gpuactckpt cpu32 --bound $bound_fp32 || echo FAILED
    cmp gpu_resumes_gpu gpu32 --exact --from-step "$every" || echo FAILED
    cmp cpu_resumes_gpu gpu32 --bound $bound_fp32 --from-step "$every" || echo FAILED
    cmp gpu_resumes_cpu cpu32 --bound $bound_fp32 --from-step "$every" || echo FAILED
  )
  echo "$lines"
  bad=$(echo "$lines" | grep -c '^FAILED' || true)
  if [ "$bad" != 0 ]; then note "$bad of 9 loss comparisons out of bounds (see train.log)"; return 1; fi
  local what="9 comparisons within bounds (fp32 $bound_fp32, tf32 $bound_tf32, bf16 $bound_bf16, fp16 $bound_fp16; resume on the same device exact)"
  [ "$dry" = 1 ] && what="dry run (the CPU for the GPU, $steps steps): $what"
  note "$what"
}

# Dense peak TFLOP/s of the GPU for the MFU (NVIDIA's datasheets, without sparsity), by its name.
peaks_for() {
  case "$1" in
    *H100*PCIe*) echo "756 378" ;;
    *H100*|*H200*|*GH200*) echo "989 495" ;;
    *A100*) echo "312 156" ;;
    *L40S*) echo "362 183" ;;
    *) echo "0 0" ;;
  esac
}

stage_bench() {
  facts
  local dir=$out/bench rc=0
  rm -rf "$dir"; mkdir -p "$dir"
  local L=12 H=12 C=768 T=1024 V=50257 B=$batch steps=20 dev=cuda skip=5
  if [ "$dry" = 1 ]; then L=2; H=2; C=64; T=64; V=4096; B=2; steps=4; dev=cpu; skip=1; export OMP_NUM_THREADS=1; fi
  $tools tokens "$dir/train.bin" --count $((B * T * (steps + 2) + 1)) --vocab $V || { note "token file"; return 1; }
  cat > "$dir/bench.ini" <<EOF
[model]
n_layer = $L
n_head = $H
n_embd = $C
vocab_size = $V
block_size = $T
[train]
train_batch = $B
micro_batch = $B
max_steps = $steps
eval_interval = 0
[optim]
lr = 0.0006
warmup_steps = 2
[data]
train_file = $dir/train.bin
[log]
interval = 1
[checkpoint]
interval = -1
EOF
  local p
  p=$(peaks_for "$gpu_name")
  local pk_bf16=${peak_bf16:-${p% *}} pk_tf32=${peak_tf32:-${p#* }}
  [ "$dry" = 1 ] && { pk_bf16=${peak_bf16:-1}; pk_tf32=${peak_tf32:-1}; }
  for mode in bf16 tf32; do
    local prec=bf16 tf=0 pk=$pk_bf16
    [ "$mode" = tf32 ] && { prec=fp32; tf=1; pk=$pk_tf32; }
    echo "== GPT-2 $L x $C, T $T, batch $B, $mode on $dev"
    local memlog=$dir/$mode.mem poller=""
    if [ "$dry" = 0 ]; then
      ( while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; sleep 0.5; done ) \
        > "$memlog" &
      poller=$!
    fi
    FSDP_CUDA_TF32=$tf timeout 400 "$worker" "$dir/bench.ini" --train.device=$dev --fsdp.mixed_precision=$prec \
      --log.dir="$dir/$mode/log" --checkpoint.dir="$dir/$mode/ckpt" > "$dir/$mode.out" 2>&1 ||
      { tail -5 "$dir/$mode.out"; echo "bench run $mode failed"; rc=1; }
    [ -n "$poller" ] && kill "$poller" 2>/dev/null
    local mem=0
    [ -s "$memlog" ] && mem=$(sort -n "$memlog" | tail -1 | awk '{print $1 * 1048576}')
    [ "$rc" = 0 ] && { $tools bench "$dir/$mode/log" --name "gpt2_124m_$mode" --dtype "$mode" --peak-tflops "$pk" \
      --mem-bytes "$mem" --skip $skip | tee -a "$dir/bench.txt" || rc=1; }
  done
  cat <<'EOF' | tee -a "$dir/bench.txt"
llm.c published (for comparison, not measured here): GPT-2 124M bf16 + cuDNN attention "up to ~60% MFU" on 8x A100 80GB;
  fp32/TF32, B=4 T=1024 on one A100 40GB PCIe: 73 ms/step (about 56K tokens/s). MFU = (6N + 6 L C T) tokens/s / peak.
EOF
  [ "$rc" = 0 ] || { note "a benchmark run failed (see bench.log)"; return 1; }
  note "$( [ "$dry" = 1 ] && echo "dry run (tiny model on the CPU): " )$(grep '^bench=' "$dir/bench.txt" | sed 's/ params=.*tokens_per_s=/ tokens_per_s=/; s/ peak_tflops=[^ ]*//; s/ final_loss=.*//' | tr '\n' ';')"
}

# ---- one stage in this process (--stage-only), or all of them -------------------------------------------

if [ -n "$only" ]; then
  if [ "$only" = "$fail_stage" ]; then note "failed on request (--fail $only)"; exit 1; fi
  case "$only" in env|build|kernels|nccl|train|bench) "stage_$only"; exit $? ;; esac
  echo "acceptance: unknown stage '$only'" >&2
  exit 2
fi

mkdir -p "$out"
: > "$out/summary.txt"
failures=0
for stage in env build kernels nccl train bench; do
  case ",$stages," in *",$stage,"*) ;; *) continue ;; esac
  rm -f "$out/$stage.note"
  t0=$(date +%s)
  args=(--stage-only "$stage" --build "$build" --out "$out" --batch "$batch")
  [ "$dry" = 1 ] && args+=(--dry-run)
  [ -n "$fail_stage" ] && args+=(--fail "$fail_stage")
  [ -n "$peak_bf16" ] && args+=(--peak-tflops-bf16 "$peak_bf16")
  [ -n "$peak_tf32" ] && args+=(--peak-tflops-tf32 "$peak_tf32")
  timeout -k 10 "$stage_limit" "$0" "${args[@]}" > "$out/$stage.log" 2>&1
  code=$?
  t1=$(date +%s)
  detail=$(cat "$out/$stage.note" 2>/dev/null)
  [ "$code" = 124 ] || [ "$code" = 137 ] && detail="timed out after $stage_limit s; ${detail}"
  if [ "$code" = 0 ]; then word=PASS; else word=FAIL; failures=$((failures + 1)); fi
  line="$word $stage: ${detail:-exit $code} ($((t1 - t0)) s)"
  echo "$line" | tee -a "$out/summary.txt"
done
echo "acceptance: $failures failure(s); summary in $out/summary.txt, logs beside it"
exit "$failures"
