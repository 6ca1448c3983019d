/* The CUB call the kernels make (kernels/cuda/embedding.cu), for the CUDA host emulator: DeviceRadixSort::SortPairs,
 * a stable sort of (key, value) pairs by the key's bits [begin_bit, end_bit), queued on the stream like CUB's
 * kernels. Found before CUDA's own cub/ by the emulator's include path (gpu/meson.build). */
#ifndef FSDP_GPU_EMU_CUB_DEVICE_RADIX_SORT_CUH
#define FSDP_GPU_EMU_CUB_DEVICE_RADIX_SORT_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "gpu/emu/emu.h"

namespace cub {
struct DeviceRadixSort {
    template <typename K, typename V> struct pairs_op {
        const K *keys_in;
        K *keys_out;
        const V *vals_in;
        V *vals_out;
        int n, begin_bit, end_bit;
    };

    template <typename K, typename V> static void pairs_run(void *arg)
    {
        auto *o = (pairs_op<K, V> *)arg;
        if (emu_sticky_error() != cudaSuccess)
            return;
        const K *ki = (const K *)emu_dev(o->keys_in);
        K *ko = (K *)emu_dev(o->keys_out);
        const V *vi = (const V *)emu_dev(o->vals_in);
        V *vo = (V *)emu_dev(o->vals_out);
        int bits = o->end_bit - o->begin_bit;
        unsigned long long mask = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
        auto key = [&](int i) { return ((unsigned long long)ki[i] >> o->begin_bit) & mask; };
        std::vector<int> idx((size_t)o->n);
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key(a) < key(b); });
        std::vector<K> ks((size_t)o->n);
        std::vector<V> vs((size_t)o->n);
        for (int i = 0; i < o->n; i++) {
            ks[(size_t)i] = ki[idx[(size_t)i]];
            vs[(size_t)i] = vi[idx[(size_t)i]];
        }
        std::copy(ks.begin(), ks.end(), ko);
        std::copy(vs.begin(), vs.end(), vo);
    }

    template <typename K, typename V> static void pairs_release(void *arg)
    {
        delete (pairs_op<K, V> *)arg;
    }

    /* As CUB: with temp == NULL only the scratch size is written (the emulator needs none but asks for 256 bytes,
     * so a caller that forgets to pass scratch still fails the range check). */
    template <typename K, typename V>
    static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *keys_in, K *keys_out, const V *vals_in,
                                 V *vals_out, int n, int begin_bit = 0, int end_bit = (int)sizeof(K) * 8,
                                 cudaStream_t stream = 0)
    {
        if (!temp) {
            temp_bytes = 256;
            return cudaSuccess;
        }
        if (n <= 0)
            return cudaSuccess;
        size_t kb = (size_t)n * sizeof(K), vb = (size_t)n * sizeof(V);
        if (emu_check_device_range("cub::DeviceRadixSort::SortPairs", "the scratch", temp, temp_bytes) ||
            emu_check_device_range("cub::DeviceRadixSort::SortPairs", "keys_in", keys_in, kb) ||
            emu_check_device_range("cub::DeviceRadixSort::SortPairs", "keys_out", keys_out, kb) ||
            emu_check_device_range("cub::DeviceRadixSort::SortPairs", "values_in", vals_in, vb) ||
            emu_check_device_range("cub::DeviceRadixSort::SortPairs", "values_out", vals_out, vb))
            return cudaErrorInvalidValue;
        auto *o = new pairs_op<K, V>{keys_in, keys_out, vals_in, vals_out, n, begin_bit, end_bit};
        return emu_enqueue(stream, "cub::DeviceRadixSort::SortPairs", pairs_run<K, V>, o, pairs_release<K, V>);
    }
};
} // namespace cub

#endif
