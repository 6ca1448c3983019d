#!/usr/bin/env bash
# The bugs the CUDA host emulator exists to catch, planted one at a time (tests/gpu/emu/planted/*.patch) in a copy
# of the source tree built with -Dgpu_emu=true: first the unpatched copy passes each named test, then with each
# patch applied its test must fail. One line per bug, `planted=NAME test=TEST result=caught|MISSED`; the exit
# status is the number of bugs missed (or 100 when the unpatched copy fails).
#   planted_bugs.sh SOURCE_DIR [WORK_DIR]
set -u
src=$(cd "${1:?usage: planted_bugs.sh SOURCE_DIR [WORK_DIR]}" && pwd)
work=${2:-$(mktemp -d)}
mkdir -p "$work"
copy="$work/src"
rm -rf "$copy" && mkdir -p "$copy"
# tracked and untracked-but-not-ignored files: what a commit of this tree would hold
git -C "$src" ls-files -z --cached --others --exclude-standard | (cd "$src" && tar --null -T - -cf -) | tar -xf - -C "$copy"
cd "$copy" || exit 100
meson setup build -Dgpu_emu=true -Dcuda=disabled > "$work/setup.log" 2>&1 || { echo "planted_bugs: meson setup failed (see $work/setup.log)" >&2; exit 100; }

# patch | test | Criterion filter (what the patch breaks, and the quickest test that sees it)
cases="missing_syncthreads|kernels_attention_emu|kernels_attention/gpt2_head_size
swapped_transpose|kernels_ops_emu|kernels_ops/matmul_*
wrong_leading_dimension|kernels_ops_emu|kernels_ops/matmul_*
collective_before_its_event|comm_nccl_emu_w2|comm_nccl/collective_waits_for_the_compute_stream
kernels_before_the_collective|emu_train|emu_train/stream_order_holds_under_random_delays
host_reads_device_memory|emu_train|emu_train/stream_order_holds_under_random_delays"

run_case() { # test filter -> exit status of the test
  ninja -C build > "$work/build.log" 2>&1 || { echo "planted_bugs: build failed (see $work/build.log)" >&2; return 2; }
  meson test -C build --no-rebuild "$1" --test-args="--filter=$2" > "$work/test.log" 2>&1
}

while IFS='|' read -r name test filter; do
  run_case "$test" "$filter" || { echo "planted_bugs: $test ($filter) fails without any planted bug (see $work/test.log)" >&2; exit 100; }
done <<< "$cases"

missed=0
while IFS='|' read -r name test filter; do
  patch -p1 -s < "$src/tests/gpu/emu/planted/$name.patch" || { echo "planted_bugs: $name.patch does not apply" >&2; exit 100; }
  if run_case "$test" "$filter"; then
    echo "planted=$name test=$test result=MISSED"
    missed=$((missed + 1))
  else
    echo "planted=$name test=$test result=caught"
  fi
  patch -p1 -R -s < "$src/tests/gpu/emu/planted/$name.patch"
done <<< "$cases"
exit "$missed"
