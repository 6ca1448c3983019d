#!/usr/bin/env bash
# Checks a GPU kit (tests/gpu/bundle.sh) the way a GPU machine will use it, on a machine without a GPU:
#
#   tests/gpu/bundle_check.sh KIT.tar.xz [--ldd-only] [--out DIR] [--max-mib 60]
#
# 1. the archive is at most --max-mib MiB and unpacks to fsdpc-gpu-kit/ with its MANIFEST.json;
# 2. every ELF file in it resolves each library it needs (ldd, the kit's lib/ first) inside the kit or to a
#    library the GPU machine provides: glibc, libstdc++, libgcc, CUDA, NCCL, cuDNN and the driver's; only
#    the driver's may be absent here (no GPU);
# 3. unless --ldd-only: tests/gpu/acceptance.sh --dry-run from the unpacked kit passes every stage.
set -u
kit_file=${1:-}
[ -n "$kit_file" ] && [ -f "$kit_file" ] || { echo "bundle_check: usage: bundle_check.sh KIT.tar.xz [--ldd-only] [--out DIR]" >&2; exit 2; }
shift
ldd_only=0 out="" max_mib=60
while [ $# -gt 0 ]; do
  case "$1" in
    --ldd-only) ldd_only=1 ;;
    --out) out=$2; shift ;;
    --max-mib) max_mib=$2; shift ;;
    *) echo "bundle_check: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
size=$(stat -c %s "$kit_file")
if [ $(( (size + 1048575) / 1048576 )) -gt "$max_mib" ]; then
  echo "bundle_check: FAIL: $kit_file is $(( (size + 1048575) / 1048576 )) MiB, over $max_mib MiB" >&2; exit 1
fi
tmp=$(mktemp -d /tmp/fsdp-kit-check-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
xz -dc "$kit_file" | tar -C "$tmp" -xf - || { echo "bundle_check: FAIL: cannot unpack $kit_file" >&2; exit 1; }
kit=$tmp/fsdpc-gpu-kit
[ -f "$kit/MANIFEST.json" ] || { echo "bundle_check: FAIL: no fsdpc-gpu-kit/MANIFEST.json in $kit_file" >&2; exit 1; }

# Provided by the GPU machine (bundle.sh packs everything else): glibc, the C++ runtime, CUDA/NCCL/cuDNN.
base_re='^(linux-vdso|ld-linux|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn[a-z_]*|libnvidia-[a-z]*|libnvrtc[a-z-]*|libnvJitLink)\.so'
driver_re='^(libcuda|libnvidia-[a-z]*)\.so'
cuda_dirs=/usr/local/cuda/lib64
bad=0 n=0
while read -r f; do
  head -c 4 "$f" | grep -q ELF || continue
  n=$((n + 1))
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      if ! echo "$name" | grep -Eq "$driver_re"; then
        echo "bundle_check: ${f#"$tmp"/}: $name not found (neither in the kit nor provided by a GPU machine)"; bad=1
      fi
    elif [ "${path#"$kit"/}" = "$path" ] && ! echo "$name" | grep -Eq "$base_re"; then
      echo "bundle_check: ${f#"$tmp"/}: $name resolves outside the kit ($path): bundle.sh must pack it"; bad=1
    fi
  done < <(LD_LIBRARY_PATH="$kit/lib:$cuda_dirs" ldd "$f" 2>/dev/null)
done < <(find "$kit" -type f \( -perm -u+x -o -name '*.so*' \))
[ "$n" -gt 0 ] || { echo "bundle_check: FAIL: no ELF file in the kit" >&2; exit 1; }
if [ "$bad" != 0 ]; then echo "bundle_check: FAIL: libraries of the kit" >&2; exit 1; fi
echo "bundle_check: $n ELF files resolve their libraries in the kit or to the GPU machine's; $(( (size + 1048575) / 1048576 )) MiB"
[ "$ldd_only" = 1 ] && exit 0

out=${out:-$tmp/acceptance-dry}
"$kit/src/tests/gpu/acceptance.sh" --dry-run --out "$out"
code=$?
[ "$code" = 0 ] || { echo "bundle_check: FAIL: the dry run from the unpacked kit failed $code stage(s) (logs in $out)" >&2; exit 1; }
echo "bundle_check: the dry run from the unpacked kit passed every stage"
