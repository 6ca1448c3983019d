#!/usr/bin/env bash
# The GPU kit: one archive that a GPU machine with no network, no apt and no build needs to give the whole
# verdict of tests/gpu/acceptance.sh (tests/gpu/README.md says how a GPU window uses it).
#
#   tests/gpu/bundle.sh -o FILE.tar.xz [--build DIR] [--arch 90] [--llmc DIR|none] [--max-mib 60]
#
# Runs on the CPU machine. Builds (or reuses --build DIR) a release build with CUDA, packs into one
# directory `fsdpc-gpu-kit/`:
#   build/   the build tree's programs, GPU module and test binaries, at their build-tree paths
#   src/     what the stages read from the source tree: tests/gpu (the acceptance script and its tools, the
#            PyTorch peer), tests/data, tests/train/hf_check.py, tests/lsan.supp
#   lib/     every shared library those ELF files need that a GPU machine may lack: all but glibc,
#            libstdc++, libgcc and the CUDA/NCCL/cuDNN/driver libraries, which come from the GPU machine
#   llmc/    the llm.c peer's sources and run_llmc.sh, and train_gpt2cu built here for the same arch
#            (linked against a stand-in libnvidia-ml that only names the driver's symbols)
#   MANIFEST.json  commit, arch, toolkit and NCCL versions, the bundled libraries
# then checks it (tests/gpu/bundle_check.sh) and refuses an archive over --max-mib.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
out="" build="" arch=90 llmc="" max_mib=60
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift ;;
    --build) build=$2; shift ;;
    --arch) arch=$2; shift ;;
    --llmc) llmc=$2; shift ;;
    --max-mib) max_mib=$2; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "bundle: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$out" ] || { echo "bundle: -o FILE.tar.xz is required" >&2; exit 2; }
case "$out" in *.tar.xz) ;; *) echo "bundle: -o must name a .tar.xz file, not '$out'" >&2; exit 2 ;; esac
case "$out" in /*) ;; *) out=$(pwd)/$out ;; esac
export PATH="$PATH:/usr/local/cuda/bin"
command -v nvcc >/dev/null || { echo "bundle: nvcc not found (CUDA toolkit under /usr/local/cuda)" >&2; exit 1; }

# The llm.c peer's sources: ../shared/anchors/llmc beside the checkout unless --llmc names them.
if [ -z "$llmc" ]; then
  for d in "$src/../shared/anchors/llmc" "$src/shared/anchors/llmc"; do [ -d "$d/src" ] && { llmc=$d; break; }; done
fi
if [ "$llmc" != none ] && { [ -z "$llmc" ] || [ ! -f "$llmc/run_llmc.sh" ]; }; then
  echo "bundle: llm.c peer not found (../shared/anchors/llmc); name it with --llmc DIR, or --llmc none" >&2
  exit 1
fi

# ---- build -------------------------------------------------------------------------------------------
build=${build:-$src/build-gpu-kit}
case "$build" in /*) ;; *) build=$(pwd)/$build ;; esac
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$src" -Dcuda=enabled -Dgpu_arch="$arch" -Dbuildtype=release >/dev/null
fi
grep -q "have_cuda\|libfsdp_gpu" "$build/build.ninja" 2>/dev/null ||
  { echo "bundle: $build is not a CUDA build (meson -Dcuda=enabled)" >&2; exit 1; }
# What the stages run (acceptance.sh lists the same binaries; kit_binaries prints them).
bins=$("$here/acceptance.sh" --list-binaries)
# meson 1.0 gives nvcc no dependency-file flags, so a changed header (kernels/cuda/cuda_common.h, common/)
# does not rebuild the .cu objects that include it: a kit once carried objects with two layouts of one
# struct. The module's CUDA objects are always compiled anew (about 40 s on 2 cores).
find "$build/gpu" -name "*.cu.o" -delete
# shellcheck disable=SC2086
ninja -C "$build" -j "$(nproc)" $bins >/dev/null

stage=$(mktemp -d /tmp/fsdp-kit-XXXXXX)
trap 'rm -rf "$stage"' EXIT
kit=$stage/fsdpc-gpu-kit
mkdir -p "$kit/build" "$kit/src/tests" "$kit/lib"
for b in $bins; do
  mkdir -p "$kit/build/$(dirname "$b")"
  cp -p "$build/$b" "$kit/build/$b"
done
cp -r "$src/tests/gpu" "$src/tests/data" "$kit/src/tests/"
find "$kit/src/tests/gpu" -name '__pycache__' -prune -exec rm -rf {} +
mkdir -p "$kit/src/tests/train" && cp "$src/tests/train/hf_check.py" "$kit/src/tests/train/"
cp "$src/tests/lsan.supp" "$kit/src/tests/"

# ---- llm.c, built here for the same arch ------------------------------------------------------------------
llmc_note="not bundled"
if [ "$llmc" != none ]; then
  mkdir -p "$kit/llmc"
  cp -r "$llmc/src" "$llmc/run_llmc.sh" "$kit/llmc/"
  work=$stage/llmc-build
  mkdir -p "$work/nvml"
  cp -r "$llmc/src/." "$work/"
  # CUDA 13's cudaMemAdvise takes a cudaMemLocation (the one change run_llmc.sh makes too)
  sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    "$work/llmc/cuda_utils.cuh"
  # The driver's libnvidia-ml is not on a machine without a GPU: link against a stand-in that has the
  # soname and the symbols; the GPU machine's real library is what runs.
  syms="nvmlInit_v2 nvmlErrorString nvmlDeviceGetHandleByIndex_v2 nvmlDeviceGetClockInfo nvmlDeviceGetMaxClockInfo
        nvmlDeviceGetCurrentClocksThrottleReasons nvmlDeviceGetFanSpeed nvmlDeviceGetPowerManagementLimit
        nvmlDeviceGetPowerUsage nvmlDeviceGetSamples nvmlDeviceGetTemperature nvmlDeviceGetTemperatureThreshold
        nvmlDeviceGetCurrentClocksEventReasons"
  for s in $syms; do echo "int $s(void) { return 999; }"; done > "$work/nvml/stub.c"
  gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o "$work/nvml/libnvidia-ml.so" "$work/nvml/stub.c"
  if (cd "$work" && make train_gpt2cu GPU_COMPUTE_CAPABILITY="$arch" NO_MULTI_GPU=1 NO_USE_MPI=1 \
        NVCC_LDFLAGS="-lcublas -lcublasLt -L$work/nvml -lnvidia-ml" > build.log 2>&1); then
    cp "$work/train_gpt2cu" "$kit/llmc/train_gpt2cu"
    llmc_note="train_gpt2cu built for sm_$arch"
  else
    tail -20 "$work/build.log" >&2
    echo "bundle: llm.c did not build; the kit's bench stage will build it there with run_llmc.sh" >&2
    llmc_note="sources only (build failed here)"
  fi
fi

# ---- shared libraries --------------------------------------------------------------------------------------
# The GPU machine provides glibc, libstdc++/libgcc and the CUDA, NCCL, cuDNN and driver libraries; every
# other library an ELF file of the kit needs travels in lib/ (by its soname, the file it resolves to).
base_re='^(linux-vdso|ld-linux|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn[a-z_]*|libnvidia-[a-z]*|libnvrtc[a-z-]*|libnvJitLink)\.so'
elfs=$(find "$kit/build" "$kit/llmc" -type f -perm -u+x 2>/dev/null | while read -r f; do
  head -c 4 "$f" | grep -q 'ELF' && echo "$f"; done; true)
for f in $elfs; do
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if echo "$name" | grep -Eq "$base_re"; then continue; fi
  [ -f "$kit/lib/$name" ] || cp -L "$path" "$kit/lib/$name"
done

# ---- manifest, archive, check -----------------------------------------------------------------------------
commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null | grep -c . || true)
nvcc_ver=$(nvcc --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
nccl_ver=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v=v (v?".":"") $3} END{print v}' /usr/local/cuda/include/nccl.h 2>/dev/null)
python3 - "$kit" "$commit" "$dirty" "$arch" "$nvcc_ver" "$nccl_ver" "$llmc_note" "$build" <<'EOF'
import json, os, sys, datetime
kit, commit, dirty, arch, nvcc, nccl, llmc, build = sys.argv[1:]
# the module's arches are the build's gpu_arch option (a reused --build may differ from --arch)
try:
    opts = json.load(open(os.path.join(build, "meson-info", "intro-buildoptions.json")))
    arch = next(o["value"] for o in opts if o["name"] == "gpu_arch")
except (OSError, StopIteration, KeyError, ValueError):
    pass
files = sorted(os.path.relpath(os.path.join(d, f), kit) for d, _, fs in os.walk(kit) for f in fs)
json.dump({"kit": "fsdpc-gpu-kit", "commit": commit, "uncommitted_changes": int(dirty), "module_gpu_arch": arch,
           "built_with": {"nvcc": nvcc, "nccl_header": nccl},
           "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "llmc": llmc, "libraries": sorted(os.listdir(os.path.join(kit, "lib"))), "files": len(files)},
          open(os.path.join(kit, "MANIFEST.json"), "w"), indent=1)
EOF
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cf - fsdpc-gpu-kit | xz -T2 -6 > "$out.part"
mv "$out.part" "$out"
size=$(stat -c %s "$out")
mib=$(( (size + 1048575) / 1048576 ))
echo "bundle: $out, $mib MiB ($(find "$kit" -type f | wc -l) files; commit $commit, $dirty changed file(s) beside it; llm.c: $llmc_note)"
[ "$mib" -le "$max_mib" ] || { echo "bundle: the archive is $mib MiB, over the $max_mib MiB limit" >&2; exit 1; }
"$here/bundle_check.sh" "$out" --ldd-only
