#!/usr/bin/env bash
# GPU acceptance: the evidence that fsdpc's CUDA kernels, NCCL backend and training on the GPU work, and how
# fast a GPT-2 step is beside llm.c and PyTorch, from the GPU kit (tests/gpu/bundle.sh) with no build, no
# package install and no network (tests/gpu/README.md: the procedure of a GPU window).
#
#   fsdpc-gpu-kit/src/tests/gpu/acceptance.sh [--dry-run] [--out DIR] [--stages LIST] [--batch B]
#                           [--build DIR] [--fail STAGE] [--list-binaries]
#
# Two commands of at most 5 minutes each on an H100 (README.md gives the times):
#   --stages env,kernels,nccl,train     then     --stages env,bench,llama      (same --out: one acceptance.json)
# Stages (--stages picks some, comma-separated; each has its own time limit, below):
#   env      GPU, driver, CUDA runtime, cuBLAS, NCCL, cuDNN, PyTorch and transformers versions, where each
#            library was found; every ELF file of the kit resolves its libraries; the module has code for
#            this GPU. Installs nothing.
#   kernels  every CUDA kernel test (the binaries of meson's 'gpu' suite, Llama ops included) from each
#            binary's own JSON report: a skip outside the stated list below is a failure;
#            compute-sanitizer memcheck on the kernel tests at small shapes and racecheck on attention,
#            each bounded to 60 s
#   nccl     the NCCL tests at world 1; world 2 on one GPU must fail fast naming the duplicate GPU (NCCL
#            2.28) or, where NCCL allows two ranks per GPU, run; on 2+ GPUs it runs
#   train    GPT-2 and Llama, 20 steps each on device = cuda against device = cpu within the documented
#            bounds: fp32, TF32, bf16 (GPT-2 also fp16, offload, activation checkpointing); a GPU
#            checkpoint resumed on the GPU (exact) and on the CPU, a CPU one on the GPU; Hugging Face
#            exports of the GPU runs open in transformers with fsdpc's own eval loss
#   bench    GPT-2 124M, T = 1024, bf16: fsdpc's tokens/s, ms/step, peak memory, MFU (llm.c's formula),
#            the device time of each kernels-table op of its step (bench_model's profile), and in the
#            same command on the same GPU and shapes llm.c (train_gpt2cu) and PyTorch (eager and
#            torch.compile, tests/gpu/torch_gpt2_peer.py)
#   llama    a Llama 3.2 1B shape (16 x 2048, 32 heads, 8 KV heads, FFN 8192, vocabulary 128256, tied),
#            T = 2048, batch 4, bf16, random init: fsdpc's tokens/s and MFU beside PyTorch + transformers'
#            LlamaForCausalLM, eager and torch.compile (torch_gpt2_peer.py --family llama), same tokens
# OUT/acceptance.json: per stage PASS, FAIL or SKIPPED with its reason and time, the versions, every figure
# and every tool the run did not have; OUT/summary.txt one line per stage; OUT/<stage>.log each stage's
# output. The exit code is the number of FAILed stages.
#
# --dry-run proves the plumbing without a GPU (CI runs it from an unpacked kit): the same stages with the
# CPU standing in, smaller runs, and the GPU tests' skips expected. --fail STAGE (dry runs only) makes that
# stage fail, to check the counting. --build DIR runs from a build tree instead of a kit.
set -u

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)

# The binaries the stages run, at their build-tree paths (bundle.sh packs these). The kernel tests are
# meson's 'gpu' suite (tests/kernels/meson.build, tests/common/meson.build): kernels_<t>_cuda runs
# test_kernels_<t> with FSDP_KERNELS_BACKEND=cuda.
kernel_tests="ops attention crossentropy_adamw cast llama_ops"
gpu_tests="tests/kernels/test_kernels_cuda tests/kernels/test_kernels_act tests/model/test_model_act tests/kernels/test_gpu_module tests/common/test_dtype"
programs="worker/fsdp-worker worker/fsdp-prepare-data worker/fsdp-ckpt launcher/fsdp-launch gpu/libfsdp_gpu.so"
# the bench stage's per-op profile of the step (tests/bench/model/bench_model.c)
bench_programs="tests/bench/model/bench_model"
kit_binaries() {
  echo "$programs $bench_programs"
  for t in $kernel_tests; do echo "tests/kernels/test_kernels_$t"; done
  echo "$gpu_tests tests/comm/test_comm_nccl tests/util/libfsdp_no_dns.so"
}

# Skips expected on a GPU host, as `suite::test|reason` (grep -E on each skipped test's line); any other
# skip fails the stage. The context-parallel tests of test_kernels_attention feed host memory to the
# kernels, which CUDA tables refuse: test_kernels_cuda checks CUDA's context-parallel kernels instead.
expected_gpu_skips='^kernels_attention::context_parallel_[a-z0-9_]+\|the cuda kernels have no context-parallel attention on host memory$
^comm_nccl::[a-z0-9_]+\|needs 2 or more ranks'

dry=0 build="" out="" stages="env,kernels,nccl,train,bench,llama" fail_stage="" only="" batch=8
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --build) build=$2; shift ;;
    --out) out=$2; shift ;;
    --stages) stages=$2; shift ;;
    --fail) fail_stage=$2; shift ;;
    --batch) batch=$2; shift ;;
    --list-binaries) kit_binaries | tr ' ' '\n' | grep .; exit 0 ;;
    --stage-only) only=$2; shift ;; # internal: run one stage in this process
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "acceptance: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for s in ${stages//,/ }; do
  case "$s" in env|kernels|nccl|train|bench|llama) ;;
    *) echo "acceptance: unknown stage '$s' in --stages (allowed: env,kernels,nccl,train,bench,llama)" >&2; exit 2 ;;
  esac
done
if [ -n "$fail_stage" ] && [ "$dry" = 0 ]; then
  echo "acceptance: --fail is for dry runs only" >&2
  exit 2
fi

# A kit (src/../MANIFEST.json) runs its own build/ and lib/; a checkout runs --build DIR (default build-gpu).
kit=""
if [ -f "$src/../MANIFEST.json" ] && [ -z "$build" ]; then
  kit=$(cd "$src/.." && pwd)
  build=$kit/build
fi
build=${build:-$src/build-gpu}
out=${out:-$(pwd)/acceptance-out}
case "$build" in /*) ;; *) build=$(pwd)/$build ;; esac
case "$out" in /*) ;; *) out=$(pwd)/$out ;; esac
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin"
tools="python3 $here/acceptance_tools.py"
worker="$build/worker/fsdp-worker"

# ---- the environment every fsdpc program of the kit runs in ------------------------------------------------

# Directories that hold a CUDA library: the toolkit's, the loader's cache, then the NVIDIA wheels of the
# machine's python3 (PyTorch's CUDA 13 libraries).
cuda_lib_dirs() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [ -d "$d" ] && echo "$d"
  done
  python3 - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("-packages")]
seen = set()
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "cu*", "lib"))):
        if d not in seen and os.path.isdir(d):
            seen.add(d)
            print(d)
EOF
}
# find_lib SONAME: the first directory above that has it.
find_lib() {
  local d
  for d in $(cuda_lib_dirs); do [ -e "$d/$1" ] && { echo "$d"; return 0; }; done
  return 1
}
kit_env() {
  local ld="" d
  [ -n "$kit" ] && ld=$kit/lib
  [ -f "$out/libpath.txt" ] && ld=${ld:+$ld:}$(cat "$out/libpath.txt")
  if [ -n "$ld" ]; then export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
  # The module beside the programs: a kit's build tree is not where it was built.
  export FSDP_GPU_MODULE="$build/gpu/libfsdp_gpu.so"
  [ -f "$FSDP_GPU_MODULE" ] || unset FSDP_GPU_MODULE
  # The GPU tests see the host as it is (meson's gpu_test_env): a fake GPU host set by a caller (meson's
  # test_env, when the dry run is itself a test) would make them fail instead of skipping.
  unset FSDP_TEST_GPU_HOST FSDP_TEST_GPU_COUNT
  # meson's test environment (tests/meson.build), which the test binaries expect
  export FSDP_BUILD_ROOT="$build" FSDP_SOURCE_ROOT="$src" CRITERION_VERBOSITY_LEVEL=1
  export LSAN_OPTIONS="suppressions=$src/tests/lsan.supp"
  d=$build/tests/util/libfsdp_no_dns.so
  if [ -f "$d" ]; then no_dns_preload="$d"; fi
}

# ---- helpers -------------------------------------------------------------------------------------------

note() { printf '%s\n' "$*" > "$out/$only.note"; echo "note: $*"; }
missing() { printf '%s\n' "$*" >> "$out/$only.missing"; echo "missing: $*"; }
facts() { [ -f "$out/env.txt" ] && . "$out/env.txt"; cc=${cc:-90}; ndev=${ndev:-1}; gpu_name=${gpu_name:-}; }
# The python that has PyTorch: the GPU machine's python3; CI's PyPI venv in a dry run.
torch_python() {
  local p
  for p in python3 ${FSDP_TORCH_VENV:+$FSDP_TORCH_VENV/bin/python}; do
    env -u LD_LIBRARY_PATH "$p" -c 'import torch' >/dev/null 2>&1 && { echo "$p"; return 0; }
  done
  return 1
}

# run_criterion NAME EXE [ENV=VALUE...] -- [ARGS...]: one test binary with its JSON report in OUT/criterion,
# then its counts and its skips outside the expected list (acceptance_tools.py criterion).
run_criterion() {
  local name=$1 exe=$2; shift 2
  local envs=() json=$out/criterion/$name.json
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mkdir -p "$out/criterion"; rm -f "$json"
  echo "== $name: ${envs[*]:-} $exe $*"
  # the no-DNS guard as meson preloads it, except into a sanitizer build (ASan's runtime must come first)
  local preload=()
  if [ -n "${no_dns_preload:-}" ] && ! ldd "$exe" 2>/dev/null | grep -q libasan; then
    preload=(LD_PRELOAD="$no_dns_preload")
  fi
  env "${preload[@]}" "${envs[@]}" timeout 240 "$exe" --json="$json" "$@" > "$out/criterion/$name.out" 2>&1
  local code=$?
  grep -E '^\[(FAIL|SKIP|----)\]|Synthesis' "$out/criterion/$name.out" | head -60
  local allow=""
  [ "$dry" = 0 ] && allow=$out/expected_skips.txt
  $tools criterion "$json" --name "$name" --exit-code "$code" ${allow:+--allow-skips "$allow"} \
    $([ "$dry" = 1 ] && echo --skips-ok)
}

# ---- stages --------------------------------------------------------------------------------------------

stage_env() {
  local nvcc_ver q name drv cap mem n drv_cuda rc=0
  nvcc_ver=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
  [ -n "$kit" ] && { echo "kit: $kit"; cat "$kit/MANIFEST.json"; echo; }
  # Where this machine's CUDA libraries are: the kit's module needs them, the programs load the module.
  local libdirs="" l d found=""
  for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    if d=$(find_lib "$l"); then
      found="$found $l=$d"
      case ":$libdirs:" in *":$d:"*) ;; *) libdirs=${libdirs:+$libdirs:}$d ;; esac
    elif [ "$dry" = 0 ]; then
      missing "$l (searched: $(cuda_lib_dirs | tr '\n' ' '))"; rc=1
    fi
  done
  echo "$libdirs" > "$out/libpath.txt"
  echo "CUDA libraries:$found"
  kit_env
  # Versions from the files the loader will use (names carry them) and from the machine's PyTorch.
  local nccl_file cudnn_file cublas_file torch_info
  nccl_file=$(ls "$(find_lib libnccl.so.2 || echo /nonexistent)"/libnccl.so.2.* 2>/dev/null | head -1)
  cublas_file=$(ls "$(find_lib libcublas.so.13 || echo /nonexistent)"/libcublas.so.13.* 2>/dev/null | head -1)
  cudnn_file=$(ls "$(find_lib libcudnn.so.9 || echo /nonexistent)"/libcudnn.so.9.* 2>/dev/null | head -1)
  local tpy
  tpy=$(torch_python) || tpy=python3
  torch_info=$(env -u LD_LIBRARY_PATH "$tpy" -c 'import torch, transformers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-", transformers.__version__)' 2>/dev/null)
  local san ncu
  san=$(command -v compute-sanitizer || true); ncu=$(command -v ncu || true)
  [ -n "$san" ] || { [ "$dry" = 1 ] || missing "compute-sanitizer (the kernels stage's memcheck/racecheck do not run)"; }
  [ -n "$torch_info" ] || missing "python3 with torch and transformers (the PyTorch peer and the Hugging Face check)"
  {
    echo "nvcc='${nvcc_ver}'"
    echo "nccl_lib='${nccl_file##*/}'"; echo "cublas_lib='${cublas_file##*/}'"; echo "cudnn_lib='${cudnn_file##*/}'"
    echo "torch_info='${torch_info}'"; echo "sanitizer='$san'"; echo "ncu='$ncu'"
  } > "$out/env.txt"
  # Every ELF file of the kit resolves its libraries here (the kit's lib/ first, then this machine's).
  if [ -n "$kit" ]; then
    local unresolved
    unresolved=$(find "$kit/build" "$kit/llmc" -type f -perm -u+x 2>/dev/null | while read -r f; do
        head -c 4 "$f" | grep -q ELF || continue
        ldd "$f" 2>/dev/null | grep 'not found' | sed "s|^|${f#"$kit"/}: |"; done)
    if [ -n "$unresolved" ]; then
      echo "unresolved libraries:"; echo "$unresolved"
      if [ "$dry" = 0 ] || echo "$unresolved" | grep -v 'libnvidia-ml' | grep -q .; then
        note "libraries not found: $(echo "$unresolved" | awk '{print $2}' | sort -u | tr '\n' ' ')"; return 1
      fi
    fi
  fi
  if [ "$dry" = 1 ]; then
    { echo "cc=90"; echo "ndev=1"; echo "gpu_name='dry run'"; } >> "$out/env.txt"
    $tools envjson "$out" --dry-run
    note "dry run: nvcc ${nvcc_ver:-none}, the kit's libraries resolve, no GPU"
    return $rc
  fi
  if ! command -v nvidia-smi >/dev/null; then note "no nvidia-smi: no NVIDIA driver on this machine"; return 1; fi
  q=$(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>&1) ||
    { note "nvidia-smi failed: $q"; return 1; }
  echo "GPUs:"; echo "$q"
  IFS=, read -r name drv cap mem <<< "$(echo "$q" | head -1)"
  name=$(echo "$name" | xargs); drv=$(echo "$drv" | xargs); cap=$(echo "$cap" | xargs); mem=$(echo "$mem" | xargs)
  n=$(echo "$q" | grep -c .)
  drv_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -1)
  { echo "cc=${cap/./}"; echo "ndev=$n"; echo "gpu_name='$name'"; echo "gpu_mem='$mem'"; echo "driver='$drv'"
    echo "driver_cuda='$drv_cuda'"; } >> "$out/env.txt"
  $tools envjson "$out"
  if [ -n "$drv_cuda" ] && [ "${drv_cuda%%.*}" -lt 13 ]; then
    note "driver $drv runs CUDA $drv_cuda at most but this kit is CUDA 13 (it needs R580 or newer): cudaGetDeviceCount would fail with error 35; update the driver"
    return 1
  fi
  python3 "$here/fatbin_arches.py" "$build/gpu/libfsdp_gpu.so" --runs-on "${cap/./}" ||
    { note "the kit's GPU module has no code a compute capability $cap GPU runs (bundle.sh --arch ${cap/./})"; return 1; }
  [ "$rc" = 0 ] || { note "CUDA libraries missing: $(cat "$out/env.missing" | tr '\n' ';')"; return 1; }
  note "$n x $name ($mem, sm_${cap/./}), driver $drv (CUDA $drv_cuda), ${cublas_file##*/}, ${nccl_file##*/}, ${cudnn_file##*/:-no cuDNN}; torch ${torch_info:-none}"
}

stage_kernels() {
  facts; kit_env
  local rc=0 t
  printf '%s\n' "$expected_gpu_skips" > "$out/expected_skips.txt"
  for t in $kernel_tests; do
    run_criterion "kernels_${t}_cuda" "$build/tests/kernels/test_kernels_$t" FSDP_KERNELS_BACKEND=cuda -- -j2 || rc=1
  done
  for t in $gpu_tests; do run_criterion "$(basename "$t" | sed 's/^test_//')" "$build/$t" -- -j2 || rc=1; done
  if [ "$dry" = 1 ]; then
    [ "$rc" = 0 ] || { note "the GPU tests failed without a GPU"; return 1; }
    note "dry run: every GPU test binary ran (their CUDA cases skip without a GPU)"
    return 0
  fi
  [ "$rc" = 0 ] || note "a GPU test failed or skipped outside the expected list (see kernels.log)"
  # compute-sanitizer: memcheck over the kernel comparisons at the tests' small shapes, racecheck over
  # attention (shared tiles, warp shuffles), each bounded to 60 s; a timeout is reported, not passed.
  local san=${sanitizer:-}
  if [ -z "$san" ]; then
    echo "compute-sanitizer not installed: memcheck and racecheck not run"
    echo "sanitizers=not_installed" >> "$out/kernels.figures"
    return $rc
  fi
  local small='kernels_cuda/@(memory_ops|elementwise_match_cpu|layernorm_matches_cpu|embedding_matches_cpu|crossentropy_matches_cpu|adamw_matches_cpu|casts_give_identical_bits|matmul_matches_cpu|sqnorm_matches_cpu_and_is_deterministic|host_copies_are_staged_and_ordered)'
  local tool exe filter code
  for tool in memcheck racecheck; do
    exe=$build/tests/kernels/test_kernels_cuda filter=$small
    [ "$tool" = racecheck ] && filter='kernels_cuda/@(attention_matches_cpu|attention_cp_allgather_matches_cpu)'
    echo "== compute-sanitizer --tool $tool ${exe##*/} --filter '$filter'"
    # --report-api-errors no: memory_ops asks for more memory than the GPU has, on purpose
    timeout -k 5 60 "$san" --tool "$tool" --error-exitcode 99 --report-api-errors no --target-processes all "$exe" \
      -j1 --filter="$filter" \
      > "$out/sanitizer-$tool.log" 2>&1
    code=$?
    tail -15 "$out/sanitizer-$tool.log"
    case $code in
      0) echo "sanitizer_$tool=clean" >> "$out/kernels.figures" ;;
      124|137) echo "sanitizer_$tool=timed_out_60s" >> "$out/kernels.figures"; echo "$tool did not finish in 60 s"; rc=1 ;;
      *) echo "sanitizer_$tool=errors_exit_$code" >> "$out/kernels.figures"; echo "$tool found errors (exit $code)"; rc=1 ;;
    esac
  done
  if [ "$rc" = 0 ]; then
    note "every GPU test passed, only the stated skips; compute-sanitizer memcheck and racecheck clean"
  else
    note "$(cat "$out/kernels.note" 2>/dev/null | sed 's/^note: //')$(grep -v '=clean' "$out/kernels.figures" 2>/dev/null | tr '\n' ' ')"
  fi
  return $rc
}

stage_nccl() {
  facts; kit_env
  local rc=0
  echo "== world 1"
  printf '%s\n' "$expected_gpu_skips" > "$out/expected_skips.txt"
  FSDP_TEST_NCCL_WORLD=1 run_criterion comm_nccl_world1 "$build/tests/comm/test_comm_nccl" FSDP_TEST_NCCL_WORLD=1 -- -j1 ||
    { note "the NCCL tests failed at world 1"; return 1; }
  echo "== world 2 on $ndev GPU(s)"
  local t0 t1 code log=$out/nccl-world2.log
  t0=$(date +%s)
  # one GPU: NCCL 2.28 refuses ("Duplicate GPU detected"); NCCL 2.30 runs it with this variable
  FSDP_TEST_NCCL_WORLD=2 NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 45 \
    "$build/tests/comm/test_comm_nccl" --filter='comm_nccl/collectives_on_gpus' > "$log" 2>&1
  code=$?
  t1=$(date +%s)
  cat "$log"
  echo "world2_seconds=$((t1 - t0))" >> "$out/nccl.figures"
  if [ "$dry" = 1 ]; then
    [ "$code" = 0 ] || { note "dry run: the NCCL test binary failed without a GPU (exit $code)"; return 1; }
    note "dry run: world 1 and world 2 ran their plumbing (the NCCL tests skip without a GPU)"
  elif [ "$code" = 0 ] && ! grep -q '^\[SKIP\]' "$log"; then
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
bound_fp32=1e-5
bound_tf32=2e-4
bound_bf16=5e-4
bound_fp16=5e-4
bound_hf=1e-4

stage_train() {
  facts; kit_env
  local dir=$out/train steps=20 every=10 gpu=cuda rc=0 C=128 T=64
  # dry: the CPU stands in for the GPU, on one thread (CI machines are small and shared), a smaller model
  if [ "$dry" = 1 ]; then steps=6; every=3; gpu=cpu; C=32; T=32; export OMP_NUM_THREADS=1; fi
  rm -rf "$dir"; mkdir -p "$dir"
  "$build/worker/fsdp-prepare-data" -o "$dir/data" "$src/tests/data/corpus" > "$dir/prepare.log" 2>&1 ||
    { cat "$dir/prepare.log"; note "fsdp-prepare-data failed"; return 1; }
  local fam
  for fam in gpt2 llama; do
    {
      echo "[model]"
      if [ "$fam" = llama ]; then
        echo "model_family = llama"; echo "n_kv_head = 2"; echo "intermediate_size = $((C * 3))"
        echo "rope_theta = 10000"; echo "rms_norm_eps = 1e-5"
      fi
      cat <<EOF
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
    } > "$dir/$fam.ini"
  done
  # run NAME FAMILY DEVICE [ENV=VALUE...] -- [--key=value...]
  run() {
    local name=$1 fam=$2 dev=$3; shift 3
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    echo "== $name: $fam on $dev ${envs[*]:-} $*"
    env FSDP_CUDA_TF32=0 "${envs[@]}" timeout 120 "$worker" "$dir/$fam.ini" --train.device="$dev" \
      --log.dir="$dir/$name/log" --checkpoint.dir="$dir/$name/ckpt" "$@" > "$dir/$name.out" 2>&1 ||
      { tail -5 "$dir/$name.out"; echo "run $name failed"; return 1; }
  }
  cmp() { $tools compare "$dir/$1/log/metrics.jsonl" "$dir/$2/log/metrics.jsonl" --name "$1-vs-$2" "${@:3}"; }
  local ck="--checkpoint.interval=$every" fin="--checkpoint.interval=$steps"
  run cpu32 gpt2 cpu -- --fsdp.mixed_precision=fp32 "$ck" || rc=1
  run cpubf16 gpt2 cpu -- --fsdp.mixed_precision=bf16 || rc=1
  run cpufp16 gpt2 cpu -- --fsdp.mixed_precision=fp16 || rc=1
  run gpu32 gpt2 "$gpu" -- --fsdp.mixed_precision=fp32 "$ck" || rc=1
  run gputf32 gpt2 "$gpu" FSDP_CUDA_TF32=1 -- --fsdp.mixed_precision=fp32 || rc=1
  run gpubf16 gpt2 "$gpu" -- --fsdp.mixed_precision=bf16 || rc=1
  run gpufp16 gpt2 "$gpu" -- --fsdp.mixed_precision=fp16 || rc=1
  run gpuoffload gpt2 "$gpu" -- --fsdp.mixed_precision=fp32 --fsdp.offload_params=true || rc=1
  run gpuactckpt gpt2 "$gpu" -- --fsdp.mixed_precision=fp32 --model.activation_checkpointing=true || rc=1
  local from_gpu=$dir/gpu32/ckpt/fsdp_sharded_cpt$every from_cpu=$dir/cpu32/ckpt/fsdp_sharded_cpt$every
  run gpu_resumes_gpu gpt2 "$gpu" -- --fsdp.mixed_precision=fp32 --checkpoint.resume_from="$from_gpu" || rc=1
  run cpu_resumes_gpu gpt2 cpu -- --fsdp.mixed_precision=fp32 --checkpoint.resume_from="$from_gpu" || rc=1
  run gpu_resumes_cpu gpt2 "$gpu" -- --fsdp.mixed_precision=fp32 --checkpoint.resume_from="$from_cpu" || rc=1
  run llama_cpu32 llama cpu -- --fsdp.mixed_precision=fp32 || rc=1
  run llama_cpubf16 llama cpu -- --fsdp.mixed_precision=bf16 || rc=1
  run llama_gpu32 llama "$gpu" -- --fsdp.mixed_precision=fp32 "$fin" || rc=1
  run llama_gputf32 llama "$gpu" FSDP_CUDA_TF32=1 -- --fsdp.mixed_precision=fp32 || rc=1
  run llama_gpubf16 llama "$gpu" -- --fsdp.mixed_precision=bf16 || rc=1
  [ "$rc" = 0 ] || { note "a training run failed (see train.log)"; return 1; }
  local lines
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
    cmp llama_gpu32 llama_cpu32 --bound $bound_fp32 || echo FAILED
    cmp llama_gputf32 llama_cpu32 --bound $bound_tf32 || echo FAILED
    cmp llama_gpubf16 llama_cpubf16 --bound $bound_bf16 || echo FAILED
  )
  echo "$lines"
  echo "$lines" | grep '^compare=' > "$out/train.figures"
  local bad
  bad=$(echo "$lines" | grep -c '^FAILED' || true)
  # Hugging Face exports of the GPU runs' last checkpoints: transformers' loss on the windows fsdpc's eval
  # reads must be fsdpc's own (both fp32).
  local hf_bad=0 hf_done=0 py
  if py=$(torch_python) && env -u LD_LIBRARY_PATH "$py" -c 'import transformers' >/dev/null 2>&1; then
    local m ck
    for m in gpt2:gpu32 llama:llama_gpu32; do
      ck=$dir/${m#*:}/ckpt
      echo "== Hugging Face export of ${m#*:} ($ck)"
      if "$build/worker/fsdp-ckpt" export "$ck" "$dir/hf_${m%%:*}" > "$dir/hf_${m%%:*}.out" 2>&1 &&
         "$build/worker/fsdp-ckpt" eval "$ck" --data "$dir/data/val.bin" --steps 2 --batch 4 --block_size "$T" \
           --json "$dir/hf_${m%%:*}.eval.json" >> "$dir/hf_${m%%:*}.out" 2>&1 &&
         env -u LD_LIBRARY_PATH "$py" "$here/hf_loss.py" "$dir/hf_${m%%:*}" "$dir/data/val.bin" 4 "$T" 2 \
           --fsdpc-json "$dir/hf_${m%%:*}.eval.json" --bound $bound_hf --name "hf_${m%%:*}" \
           | tee -a "$out/train.figures" | grep -q 'result=PASS'; then
        hf_done=$((hf_done + 1))
      else
        tail -5 "$dir/hf_${m%%:*}.out"; echo "Hugging Face check of ${m#*:} failed"; hf_bad=$((hf_bad + 1))
      fi
    done
  else
    missing "python3 with transformers: the Hugging Face export check of the train stage did not run"
  fi
  if [ "$bad" != 0 ] || [ "$hf_bad" != 0 ]; then
    note "$bad of 12 loss comparisons out of bounds, $hf_bad of 2 Hugging Face checks failed (see train.log)"; return 1
  fi
  local what="12 comparisons within bounds (GPT-2 and Llama; fp32 $bound_fp32, tf32 $bound_tf32, bf16 $bound_bf16, fp16 $bound_fp16; resume on the same device exact); $hf_done of 2 Hugging Face exports give fsdpc's loss in transformers (within $bound_hf)"
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

# fsdpc_bench DIR INI LIMIT NAME PEAK SKIP FIGURES: fsdp-worker on DIR/INI in bf16 on the stage's device (at
# most LIMIT seconds, the GPU's memory polled meanwhile), then its `bench=NAME` line appended to FIGURES.
fsdpc_bench() {
  local d=$1 ini=$2 lim=$3 name=$4 peak=$5 skip=$6 fig=$7 memlog=$1/mem.txt poller="" mem=0
  if [ "$dry" = 0 ]; then
    ( while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; sleep 0.5; done ) \
      > "$memlog" &
    poller=$!
  fi
  local ok=0
  FSDP_CUDA_TF32=1 timeout "$lim" "$worker" "$d/$ini" --train.device=$dev --fsdp.mixed_precision=bf16 \
    --log.dir="$d/fsdpc/log" --checkpoint.dir="$d/fsdpc/ckpt" > "$d/fsdpc.out" 2>&1 ||
    { tail -5 "$d/fsdpc.out"; echo "fsdpc run $name failed"; ok=1; }
  [ -n "$poller" ] && kill "$poller" 2>/dev/null
  [ -s "$memlog" ] && mem=$(sort -n "$memlog" | tail -1 | awk '{print $1 * 1048576}')
  [ "$ok" = 0 ] || return 1
  $tools bench "$d/fsdpc/log" --name "$name" --dtype bf16 --peak-tflops "$peak" --mem-bytes "$mem" --skip "$skip" |
    tee -a "$fig"
  return "${PIPESTATUS[0]}"
}

# profile_step: the per-op device times of fsdpc's step at the bench stage's shapes (bench_model's M1024 row:
# GPT-2 124M, T 1024, batch 8, bf16; each op timed between two waits for the GPU, so the times add up to more
# than an unprofiled step), as `bench=model_profile config=M1024 device=cuda precision=bf16 op=NAME
# ms_per_step=... gflops=... timing=device_sync` lines in the stage's figures: the measured column of
# docs/kernels_cuda.md's roofline plan. Expected to take about 10 s on an H100 (not yet measured), at most 45.
# A dry run profiles the dry shapes (the XS row) on the CPU. A failure is reported in the figures, not as the
# stage's: the verdict is the speed of the whole step.
profile_step() {
  local row=M1024 pdev=cuda code lines
  [ "$dry" = 1 ] && { row=XS; pdev=cpu; }
  echo "== fsdpc per-op profile: bench_model --child $row --precision bf16 --profile --device $pdev"
  FSDP_CUDA_TF32=1 timeout 45 "$build/tests/bench/model/bench_model" --child "$row" --precision bf16 --profile \
    --device "$pdev" > "$dir/profile.out" 2>&1
  code=$?
  if [ "$code" != 0 ]; then
    tail -5 "$dir/profile.out"
    echo "bench=model_profile config=$row device=$pdev precision=bf16 result=FAIL why=exit_$code" >> "$out/bench.figures"
    return 1
  fi
  lines=$(sed -n "s/^profile /bench=model_profile config=$row device=$pdev precision=bf16 /p" "$dir/profile.out")
  [ -n "$lines" ] || return 1
  echo "$lines" | tee -a "$out/bench.figures"
}

stage_bench() {
  facts; kit_env
  local dir=$out/bench rc=0
  rm -rf "$dir"; mkdir -p "$dir"
  local L=12 H=12 C=768 T=1024 V=50257 B=$batch steps=25 dev=cuda skip=5
  if [ "$dry" = 1 ]; then L=2; H=2; C=64; T=64; V=4096; B=2; steps=4; dev=cpu; skip=1; export OMP_NUM_THREADS=1; fi
  local p pk
  p=$(peaks_for "$gpu_name"); pk=${p% *}
  [ "$dry" = 1 ] && pk=1
  echo "bench_shape=GPT-2 L=$L C=$C T=$T B=$B vocab=$V peak_tflops_bf16=$pk" > "$out/bench.figures"
  # One token stream for all three: nanoGPT's format for fsdpc and PyTorch, llm.c's for llm.c.
  $tools tokens "$dir/train.bin" --count $((B * T * (steps + 3) + 1)) --vocab $V --llmc "$dir/train_llmc.bin" &&
    $tools tokens "$dir/val.bin" --count $((B * T + 1)) --vocab $V --seed 99 --llmc "$dir/val_llmc.bin" ||
    { note "token files"; return 1; }
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
  echo "== fsdpc: GPT-2 $L x $C, T $T, batch $B, bf16 on $dev"
  fsdpc_bench "$dir" bench.ini 90 fsdpc_gpt2_124m_bf16 "$pk" "$skip" "$out/bench.figures" || rc=1
  profile_step || echo "the per-op profile gave no lines (see bench/profile.out)"
  # llm.c: the kit's train_gpt2cu (built for this arch by bundle.sh), else built here by run_llmc.sh.
  if [ "$dry" = 1 ]; then
    echo "llm.c: dry run, no GPU"; echo "llmc=skipped_dry_run" >> "$out/bench.figures"
  else
    local llmc_dir=${kit:+$kit/llmc} llog=$dir/llmc.out
    [ -n "$llmc_dir" ] || llmc_dir=$src/../shared/anchors/llmc
    echo "== llm.c ($llmc_dir): GPT-2 d12, T $T, batch $B, bf16"
    if [ -x "$llmc_dir/train_gpt2cu" ]; then
      (cd "$dir" && timeout 80 "$llmc_dir/train_gpt2cu" -i "$dir/train_llmc.bin" -j "$dir/val_llmc.bin" -e d12 \
         -b "$B" -t "$T" -d $((B * T)) -x "$steps" -v 100000 -s 100000 -m 1 -g 0 -h 0) > "$llog" 2>&1
    elif [ -f "$llmc_dir/run_llmc.sh" ] && command -v nvcc >/dev/null; then
      timeout 120 bash "$llmc_dir/run_llmc.sh" "$dir/llmc-build" "$dir/train_llmc.bin" "$dir/val_llmc.bin" \
        "$B" "$T" "$steps" > "$llog" 2>&1
    else
      echo "no llm.c here" > "$llog"; missing "llm.c (neither the kit's train_gpt2cu nor its sources with nvcc)"
    fi
    tail -4 "$llog"
    $tools llmc "$llog" --peak-tflops "$pk" --skip $skip --params-of "$dir/fsdpc/log" | tee -a "$out/bench.figures" ||
      echo "llm.c gave no timed steps (see bench/llmc.out)"
  fi
  # PyTorch: eager and torch.compile, bf16 autocast, fused AdamW, the same tokens.
  local py mode
  if py=$(torch_python); then
    for mode in eager compile; do
      echo "== PyTorch $mode ($py)"
      env -u LD_LIBRARY_PATH timeout $([ $mode = compile ] && echo 150 || echo 60) "$py" "$here/torch_gpt2_peer.py" --mode $mode --device "$dev" \
        --batch "$B" --seq "$T" --steps $((steps - skip)) --warmup "$skip" --layers $L --heads $H --embd $C \
        --vocab $V --tokens "$dir/train.bin" --peak-tflops "$pk" --json "$dir/torch_$mode.json" \
        > "$dir/torch_$mode.out" 2>&1
      tail -3 "$dir/torch_$mode.out"
      grep '^bench=' "$dir/torch_$mode.out" >> "$out/bench.figures" || echo "PyTorch $mode gave no bench line"
    done
  else
    missing "python3 with torch: the PyTorch peers of the bench stage did not run"
  fi
  $tools ratios "$out/bench.figures" | tee -a "$out/bench.figures"
  [ "$rc" = 0 ] || { note "the fsdpc benchmark run failed (see bench.log)"; return 1; }
  note "$( [ "$dry" = 1 ] && echo "dry run (tiny model on the CPU): " )$(grep '^ratios ' "$out/bench.figures" | sed 's/^ratios //')"
}

# The same job as the bench stage's for a Llama of about 1B (Llama 3.2 1B's shape, random init): fsdpc, then
# PyTorch + transformers (eager and torch.compile) on the same tokens (llm.c's uint32 format: 128256 ids).
stage_llama() {
  facts; kit_env
  local dir=$out/llama rc=0
  rm -rf "$dir"; mkdir -p "$dir"
  local L=16 H=32 KV=8 C=2048 F=8192 T=2048 V=128256 B=4 steps=10 skip=3 dev=cuda
  if [ "$dry" = 1 ]; then L=2; H=4; KV=2; C=64; F=128; T=64; V=70000; B=2; steps=4; skip=1; dev=cpu; export OMP_NUM_THREADS=1; fi
  local p pk
  p=$(peaks_for "$gpu_name"); pk=${p% *}
  [ "$dry" = 1 ] && pk=1
  echo "llama_shape=Llama L=$L C=$C heads=$H kv_heads=$KV ffn=$F T=$T B=$B vocab=$V peak_tflops_bf16=$pk" > "$out/llama.figures"
  $tools tokens "$dir/train.bin" --count $((B * T * (steps + 3) + 1)) --vocab $V --uint32 || { note "token files"; return 1; }
  cat > "$dir/llama.ini" <<EOF
[model]
model_family = llama
n_layer = $L
n_head = $H
n_kv_head = $KV
n_embd = $C
intermediate_size = $F
vocab_size = $V
block_size = $T
rope_theta = 500000
tie_word_embeddings = true
[train]
train_batch = $B
micro_batch = $B
max_steps = $steps
eval_interval = 0
[optim]
lr = 0.0003
warmup_steps = 2
[data]
train_file = $dir/train.bin
[log]
interval = 1
[checkpoint]
interval = -1
EOF
  echo "== fsdpc: Llama $L x $C ($KV KV heads), T $T, batch $B, bf16 on $dev"
  fsdpc_bench "$dir" llama.ini 60 fsdpc_llama_1b_bf16 "$pk" "$skip" "$out/llama.figures" || rc=1
  local py mode
  if py=$(torch_python); then
    for mode in eager compile; do
      echo "== PyTorch + transformers $mode ($py)"
      env -u LD_LIBRARY_PATH timeout $([ $mode = compile ] && echo 70 || echo 30) "$py" "$here/torch_gpt2_peer.py" \
        --family llama --mode $mode --device "$dev" --batch "$B" --seq "$T" --steps $((steps - skip)) --warmup "$skip" \
        --layers $L --heads $H --kv-heads $KV --embd $C --ffn $F --vocab $V --rope-theta 500000 \
        --tokens "$dir/train.bin" --peak-tflops "$pk" --json "$dir/torch_$mode.json" > "$dir/torch_$mode.out" 2>&1
      tail -3 "$dir/torch_$mode.out"
      grep '^bench=' "$dir/torch_$mode.out" >> "$out/llama.figures" || echo "PyTorch $mode gave no bench line"
    done
  else
    missing "python3 with torch: the PyTorch peers of the llama stage did not run"
  fi
  $tools ratios "$out/llama.figures" --family llama | tee -a "$out/llama.figures"
  [ "$rc" = 0 ] || { note "the fsdpc Llama run failed (see llama.log)"; return 1; }
  note "$( [ "$dry" = 1 ] && echo "dry run (tiny model on the CPU): " )$(grep '^ratios ' "$out/llama.figures" | sed 's/^ratios //')"
}

# ---- one stage in this process (--stage-only), or the stages asked for ------------------------------------

if [ -n "$only" ]; then
  if [ "$only" = "$fail_stage" ]; then note "failed on request (--fail $only)"; exit 1; fi
  "stage_$only"; exit $?
fi

# Each stage's time limit (s): the two commands of a GPU window stay under 5 minutes each (README.md).
limit_of() { case "$1" in env) echo 40 ;; kernels) echo 200 ;; nccl) echo 60 ;; train) echo 160 ;; bench) echo 150 ;; llama) echo 140 ;; esac; }
: > "$out/summary.txt"

failures=0
for stage in env kernels nccl train bench llama; do
  case ",$stages," in *",$stage,"*) ;; *) continue ;; esac
  rm -f "$out/$stage.note" "$out/$stage.figures" "$out/$stage.missing"
  t0=$(date +%s)
  args=(--stage-only "$stage" --out "$out" --batch "$batch")
  [ -n "$kit" ] || args+=(--build "$build")
  [ "$dry" = 1 ] && args+=(--dry-run)
  [ -n "$fail_stage" ] && args+=(--fail "$fail_stage")
  lim=$(limit_of "$stage")
  # a dry run shares a CI machine's 2 cores with the rest of the suite: twice the time (a GPU run keeps its own)
  [ "$dry" = 1 ] && lim=$((lim * 2))
  timeout -k 10 "$lim" "$0" "${args[@]}" > "$out/$stage.log" 2>&1
  code=$?
  t1=$(date +%s)
  detail=$(cat "$out/$stage.note" 2>/dev/null)
  { [ "$code" = 124 ] || [ "$code" = 137 ]; } && detail="timed out after $lim s; ${detail}"
  if [ "$code" = 0 ]; then word=PASS; else word=FAIL; failures=$((failures + 1)); fi
  line="$word $stage: ${detail:-exit $code} ($((t1 - t0)) s)"
  echo "$line" | tee -a "$out/summary.txt"
  $tools stage "$out" "$stage" "$word" "$((t1 - t0))" "$lim" --detail "${detail:-exit $code}"
done
$tools report "$out" ${kit:+--manifest "$kit/MANIFEST.json"} $([ "$dry" = 1 ] && echo --dry-run)
echo "acceptance: $failures failure(s); $out/acceptance.json, summary in $out/summary.txt, logs beside it"
exit "$failures"
