// neurovec's C++ CPU kernels: segment reductions over sorted, static CSR segments, as torch operators.
//
// The kernels reduce without ever materialising per-edge rows: a fused gather -> per-edge
// coefficient -> sum (and its transpose for the backward), plain segment sums and means,
// segment max / min and their tie-splitting backward. engines/native.py builds this file on
// first use (torch.utils.cpp_extension, cached) and loads its operators, torch.ops.neurovec_cpu:
//
//   csr_sum, broadcast, extremum, extremum_backward   the kernels, without autograd: what
//       programs call under torch.compile (native.py registers their fake kernels, engines/ops.py
//       their autograd as Python Functions that dynamo traces);
//   gather_sum, segment_sum, segment_extremum         the same with their autograd in C++ (a
//       torch::autograd::Function): what programs call eagerly. On small graphs a training step
//       is mostly per-call overhead, and a call costs ~2 µs of dispatch where a Python
//       autograd.Function costs ~6 µs forward and runs Python again backward;
//   chunk_weight_grad                                   the weights' gradient of a chunked relational
//       product read by a gather sum, without the (rows, width) intermediate (called from
//       engines/runtime.py's autograd Functions, eagerly);
//   chunk_product                                       a chunked relational product (its forward);
//   gathered_chunk_product, gathered_chunk_backward     a chunked relational product of gathered
//       rows and its two gradients, without the gathered rows (the same, eagerly).
//
// Where this file cannot be built, every caller uses its pure-torch equivalent (engines/kernels.py);
// tests compare them. Values are float32 or float64; index tensors int32 or int64
// (AT_DISPATCH_INDEX_TYPES). The ops trust what the compiler guarantees: ptr is sorted from 0 to
// the number of entries, col indexes rows of x.
//
// Layout: values are row-major (rows, width) arrays; segment j owns the CSR range
// ptr[j] .. ptr[j+1]-1 of "entries" e. An entry reads source row col[e] (or row e
// when col is null: a plain segment reduction) times val[e] (1 when val is null).
// Nothing ever writes to the same output row from two threads: threads own
// disjoint ranges of segments, balanced by their number of entries.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/segment_reduce.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

// NOTE: [huge pages for large outputs] A large output is a fresh block of memory (glibc maps blocks
// over 32 MiB anew on every allocation), and the kernel's first write to each 4 KiB page of it is a
// page fault: on this VM about 4 µs each, more than the sum itself costs per page. So an output of
// at least kHugeOutputBytes asks for transparent huge pages before it is written (madvise, where
// the system has THP in "madvise" or "always" mode; elsewhere the call is a harmless no-op): one
// fault per 2 MiB. arxiv-like's 128-wide sparse sum (benchmarks/kernels_hugepages.py: 87k rows from
// 1.17M entries, 1 thread, loaded, CPU ms, medians of 6): forward 66.2 -> 41.4 (10.9k -> 0.7k page
// faults), forward and backward 157 -> 94.5 (32.1k -> 0.9k). torch's own ops do the same only with
// THP_MEM_ALLOC_ENABLE=1 set before torch starts. Values are unchanged: only where the memory comes from.
constexpr int64_t kHugePageBytes = int64_t(2) << 20;
constexpr int64_t kHugeOutputBytes = int64_t(8) << 20;

// at::empty(sizes, options), on huge pages where it is large (NOTE: [huge pages for large outputs]).
at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
    at::Tensor y = at::empty(sizes, options);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const int64_t bytes = y.numel() * (int64_t)y.element_size();
    if (bytes >= kHugeOutputBytes) {
        const uintptr_t start = reinterpret_cast<uintptr_t>(y.data_ptr());
        const uintptr_t begin = (start + kHugePageBytes - 1) & ~uintptr_t(kHugePageBytes - 1);
        const uintptr_t end = (start + bytes) & ~uintptr_t(kHugePageBytes - 1);
        if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
    }
#endif
    return y;
}

at::Tensor empty_output_like(const at::Tensor& x) { return empty_output(x.sizes(), x.options()); }


// Below this many multiply-adds a kernel runs on the calling thread: waking other
// threads costs a few microseconds, more than the work itself.
constexpr int64_t kParallelWork = 32768;

// Segments [begin[t], begin[t+1]) go to thread t, with about the same number of
// entries each (a binary search of ptr for every split point). The first thread starts
// at segment 0 and the last ends at n_rows, so that empty segments before the first
// entry or after the last one (sources nothing reads, in a transposed CSR) belong to
// a thread too: every output row is written.
template <typename I>
int64_t split_point(const I* ptr, int64_t n_rows, int t, int n_threads) {
    if (t <= 0) return 0;
    if (t >= n_threads) return n_rows;
    const int64_t total = ptr[n_rows];
    const int64_t target = total * t / n_threads;
    int64_t lo = 0, hi = n_rows;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if ((int64_t)ptr[mid] < target) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// The feature width as a template argument for the common narrow widths (W > 0),
// so that every loop over features is unrolled into registers; Width<0> is any
// width, read at run time. (Run-time widths also make the compiler version each
// loop against aliasing: 3x slower at width 3.)
template <int W>
struct Width {
    static constexpr int value = W;
};

template <typename Body>
void with_width(int64_t w, Body body) {
    switch (w) {
        case 1: body(Width<1>{}); break;
        case 2: body(Width<2>{}); break;
        case 3: body(Width<3>{}); break;
        case 4: body(Width<4>{}); break;
        case 8: body(Width<8>{}); break;
        case 16: body(Width<16>{}); break;
        case 32: body(Width<32>{}); break;
        default: body(Width<0>{});
    }
}

// Run body(row_begin, row_end, Width<W>{}) over all segments (W: with_width's), split into
// at::get_num_threads() tasks of about equal entries, one per thread of torch's intra-op pool
// (at::parallel_for: the threads torch's own ops use, serial inside another parallel region).
// See NOTE: [threads on a busy machine] in engines/native.py.
template <typename I, typename Body>
void for_segments(const I* ptr, int64_t n_rows, int64_t width, Body body) {
    const int64_t work = (int64_t)ptr[n_rows] * (width > 0 ? width : 1);
    const int n_threads = at::get_num_threads();
    auto run = [&](int64_t r0, int64_t r1) { with_width(width, [&](auto w) { body(r0, r1, w); }); };
    if (n_threads <= 1 || work < kParallelWork || n_rows < 2) {
        run((int64_t)0, n_rows);
        return;
    }
    at::parallel_for(0, n_threads, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
            run(split_point(ptr, n_rows, (int)t, n_threads), split_point(ptr, n_rows, (int)t + 1, n_threads));
    });
}

// ---------------------------------------------------------------- weighted sums
//
// y[j] = sum_e c[e] * x[src(e)]  (src(e) = col[e], or e when col is null),
// then y[j] /= divide[j] if divide is given (a mean). Accumulates in registers
// (fixed widths) or in the output row.

// NOTE: [prefetching gathered rows] A gather sum reads its rows at random: at products-like sizes
// (a 2.4M x 128 float32 value, 160 MB at 1/8 size) nearly every row misses every cache, and a loop
// that waits for each row before it asks for the next is bound by memory latency, not bandwidth.
// So each step asks for the row kPrefetchAhead entries ahead (every cache line of it) while it adds
// the current one. Measured on random CSR matrices (1 thread, loaded, CPU ms, before -> after, with
// the single pass over wide rows below): 306k rows x 8M entries from a 306k-row value (products-like
// at 1/8), width 128 1932 -> 642, 47 648 -> 282; a million entries into 247k rows (hetero-100's
// transposed gather) width 16 20 -> 16, 32 60 -> 18-27. Rows narrower than a cache line are not
// prefetched (width 4: 6.7 -> 8.0 with it), nor those of a value that fits in kCachedBytes (about a
// core's L2 here): MUTAG's 3371 x 16 floats took 11 -> 13 µs with it (at 3371 x 32, 50 -> 22 µs: a
// gain given up with the cut-off, to keep the small 16-wide sums as they were).
constexpr int64_t kCachedBytes = 2 << 20;
constexpr int64_t kPrefetchAhead = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t n) {
    const char* p = reinterpret_cast<const char*>(row);
    for (int64_t b = 0; b < n * (int64_t)sizeof(T); b += 64) __builtin_prefetch(p + b, 0, 3);
}

// One chunk of C features (k0 .. k0 + C - 1) of row r, accumulated in registers: how the rows of
// the widths with_width names go (one chunk each). Accumulating in the output row instead costs a
// load and a store per feature and entry.
template <int C, typename T, typename I, bool GATHER, bool WEIGHTED, bool PREFETCH>
inline void sum_chunk(int64_t r, const I* __restrict__ ptr, const I* __restrict__ col, const T* __restrict__ val,
                      const T* __restrict__ x, int64_t w, int64_t k0, T* __restrict__ y,
                      const T* __restrict__ divide, int64_t prefetch_end, bool add) {
    T acc[C];
    for (int k = 0; k < C; ++k) acc[k] = T(0);
    const int64_t e1 = ptr[r + 1];
    for (int64_t e = ptr[r]; e < e1; ++e) {
        if constexpr (PREFETCH && GATHER && C * sizeof(T) >= 64) {
            if (e + kPrefetchAhead < prefetch_end) prefetch_row(x + (int64_t)col[e + kPrefetchAhead] * w + k0, C);
        }
        const T* __restrict__ xr = x + (GATHER ? (int64_t)col[e] : e) * w + k0;
        if constexpr (WEIGHTED) {
            const T v = val[e];
#pragma omp simd
            for (int k = 0; k < C; ++k) acc[k] += v * xr[k];
        } else {
#pragma omp simd
            for (int k = 0; k < C; ++k) acc[k] += xr[k];
        }
    }
    T* __restrict__ yr = y + r * w + k0;
    if (divide) {
        const T d = divide[r];
        for (int k = 0; k < C; ++k) acc[k] /= d;
    }
    if (add) {  // y[r] + the sum, one IEEE addition: as y.add_(sum)
        for (int k = 0; k < C; ++k) yr[k] += acc[k];
    } else {
        for (int k = 0; k < C; ++k) yr[k] = acc[k];
    }
}

template <typename T, typename I, typename WT, bool GATHER, bool WEIGHTED>
void sum_rows(int64_t r0, int64_t r1, const I* __restrict__ ptr, const I* __restrict__ col,
              const T* __restrict__ val, const T* __restrict__ x, int64_t w_any, T* __restrict__ y,
              const T* __restrict__ divide, bool prefetch, bool add = false) {
    constexpr int kW = WT::value;
    const int64_t prefetch_end = prefetch ? (int64_t)ptr[r1] : 0;  // rows of entries before it are prefetched
    if constexpr (kW != 0) {  // a width with_width has a case for: the whole row is one chunk
        // Prefetching or not is a template argument here: an always-false test per entry cost
        // MUTAG's sums (3371 x 16) a sixth of their time. Rows narrower than a cache line are never
        // prefetched, and have one loop only: a second, identical copy of it beside the first made
        // PROTEINS' 1-wide sums (GCN with labels) slower (NOTE: [prefetching gathered rows]).
        if constexpr (GATHER && kW * sizeof(T) >= 64) {
            if (prefetch) {
                for (int64_t r = r0; r < r1; ++r)
                    sum_chunk<kW, T, I, GATHER, WEIGHTED, true>(r, ptr, col, val, x, kW, 0, y, divide, prefetch_end, add);
                return;
            }
        }
        for (int64_t r = r0; r < r1; ++r)
            sum_chunk<kW, T, I, GATHER, WEIGHTED, false>(r, ptr, col, val, x, kW, 0, y, divide, prefetch_end, add);
        return;
    }
    // Rows of any other width: accumulated in the output row (in L1 while it is summed), each entry's
    // row read once, whole (chunk by chunk in registers it was read once per chunk: 9 passes at 47).
    const int64_t w = w_any;
    const bool wide = GATHER && w * (int64_t)sizeof(T) >= 64;
    std::vector<T> row_sum(add ? w : 0);  // adding into y: the sum in a row of its own, then added
    for (int64_t r = r0; r < r1; ++r) {
        T* __restrict__ acc = add ? row_sum.data() : y + r * w;
        for (int64_t k = 0; k < w; ++k) acc[k] = T(0);
        const int64_t e1 = ptr[r + 1];
        for (int64_t e = ptr[r]; e < e1; ++e) {
            if (wide && e + kPrefetchAhead < prefetch_end) prefetch_row(x + (int64_t)col[e + kPrefetchAhead] * w, w);
            const T* __restrict__ xr = x + (GATHER ? (int64_t)col[e] : e) * w;
            if constexpr (WEIGHTED) {
                const T v = val[e];
#pragma omp simd
                for (int64_t k = 0; k < w; ++k) acc[k] += v * xr[k];
            } else {
#pragma omp simd
                for (int64_t k = 0; k < w; ++k) acc[k] += xr[k];
            }
        }
        if (divide) {
            const T d = divide[r];
            for (int64_t k = 0; k < w; ++k) acc[k] /= d;
        }
        if (add) {
            T* __restrict__ yr = y + r * w;
            for (int64_t k = 0; k < w; ++k) yr[k] += acc[k];
        }
    }
}

// The loop-invariant choices (gather or contiguous rows, weighted or not) are
// template arguments: as run-time branches they cost 2-4x on short segments.
template <typename T, typename I>
void segment_sum(int64_t n_rows, const I* ptr, const I* col, const T* val, const T* x, int64_t w, T* y,
                 const T* divide, bool prefetch, bool add = false) {
    for_segments(ptr, n_rows, w, [&](int64_t r0, int64_t r1, auto width) {
        using WT = decltype(width);
        if (col) {
            if (val) sum_rows<T, I, WT, true, true>(r0, r1, ptr, col, val, x, w, y, divide, prefetch, add);
            else sum_rows<T, I, WT, true, false>(r0, r1, ptr, col, val, x, w, y, divide, prefetch, add);
        } else {
            if (val) sum_rows<T, I, WT, false, true>(r0, r1, ptr, col, val, x, w, y, divide, prefetch, add);
            else sum_rows<T, I, WT, false, false>(r0, r1, ptr, col, val, x, w, y, divide, prefetch, add);
        }
    });
}

// ---------------------------------------------------------------- broadcast
//
// The backward of a plain segment sum / mean: every entry of segment j gets
// g[j] (times val[e], divided by divide[j]): out[e] = c[e] * (g[j] / d[j]).
template <typename T, typename I, typename WT, bool WEIGHTED>
void broadcast_rows(int64_t r0, int64_t r1, const I* __restrict__ ptr, const T* __restrict__ val,
                    const T* __restrict__ g, int64_t w_any, T* __restrict__ out, const T* __restrict__ divide) {
    constexpr int kW = WT::value;
    const int64_t w = kW ? kW : w_any;
    constexpr int kAcc = kW ? kW : 1;
    for (int64_t r = r0; r < r1; ++r) {
        const T* __restrict__ gr = g + r * w;
        const int64_t e1 = ptr[r + 1];
        if (divide && !kW) {  // any width: divide per entry
            const T d = divide[r];
            for (int64_t e = ptr[r]; e < e1; ++e) {
                const T v = WEIGHTED ? val[e] : T(1);
                for (int64_t k = 0; k < w; ++k) out[e * w + k] = WEIGHTED ? v * (gr[k] / d) : gr[k] / d;
            }
            continue;
        }
        // Fixed widths: the row divided once, in registers.
        T row_fixed[kAcc];
        if (divide) {
            const T d = divide[r];
            for (int64_t k = 0; k < w; ++k) row_fixed[k] = gr[k] / d;
            gr = row_fixed;
        }
        for (int64_t e = ptr[r]; e < e1; ++e) {
            T* __restrict__ o = out + e * w;
            if constexpr (WEIGHTED) {
                const T v = val[e];
#pragma omp simd
                for (int64_t k = 0; k < w; ++k) o[k] = v * gr[k];
            } else {
#pragma omp simd
                for (int64_t k = 0; k < w; ++k) o[k] = gr[k];
            }
        }
    }
}

template <typename T, typename I>
void segment_broadcast(int64_t n_rows, const I* ptr, const T* val, const T* g, int64_t w, T* out,
                       const T* divide) {
    for_segments(ptr, n_rows, w, [&](int64_t r0, int64_t r1, auto width) {
        using WT = decltype(width);
        if (val) broadcast_rows<T, I, WT, true>(r0, r1, ptr, val, g, w, out, divide);
        else broadcast_rows<T, I, WT, false>(r0, r1, ptr, val, g, w, out, divide);
    });
}

// ---------------------------------------------------------------- max / min
//
// Forward: y[j] = max (min) over the segment's rows, per feature; NaN wins (like
// torch.amax). Backward: the gradient of y[j] is split evenly among the rows that
// equal it: out[e] = (x[e] == y[j]) ? g[j] / ties : (g[j] / ties) * 0, exactly the
// floats of mask * (g / ties)[seg] in kernels.py (a NaN extremum has no ties, so
// its whole segment gets NaN, as there).

template <bool MAX, typename T>
inline T pick(T v, T m) {
    // A NaN stays once there ("v > NaN" is false) and replaces anything.
    // "|" not "||": no branch (the comparisons are data-dependent, a branch mispredicts).
    const bool take = (MAX ? v > m : v < m) | (v != v);
    return take ? v : m;
}

template <bool MAX, typename T, typename I>
void segment_extremum(int64_t n_rows, const I* ptr, const I* col, const T* x, int64_t w, T* y) {
    for_segments(ptr, n_rows, w, [&](int64_t r0, int64_t r1, auto width) {
        constexpr int kW = decltype(width)::value;
        const int64_t ww = kW ? kW : w;
        constexpr int kAcc = kW ? kW : 1;
        for (int64_t r = r0; r < r1; ++r) {
            T* __restrict__ yr = y + r * ww;
            // Fixed widths keep the running extremum in registers: writing it to y
            // and reading it back each row stalls on store forwarding (4-10x slower).
            T m_fixed[kAcc];
            T* __restrict__ m = kW ? m_fixed : yr;
            const int64_t e0 = ptr[r], e1 = ptr[r + 1];
            if (e0 == e1) {  // an empty segment (never compiled): the identity, like torch.segment_reduce
                for (int64_t k = 0; k < ww; ++k) yr[k] = MAX ? -INFINITY : INFINITY;
                continue;
            }
            const T* __restrict__ first = x + (col ? (int64_t)col[e0] : e0) * ww;
            for (int64_t k = 0; k < ww; ++k) m[k] = first[k];
            for (int64_t e = e0 + 1; e < e1; ++e) {
                const T* __restrict__ xr = x + (col ? (int64_t)col[e] : e) * ww;
                // "omp simd": without it gcc emits branchy scalar code here (10x slower).
#pragma omp simd
                for (int64_t k = 0; k < ww; ++k) m[k] = pick<MAX>(xr[k], m[k]);
            }
            if (kW) for (int64_t k = 0; k < ww; ++k) yr[k] = m[k];
        }
    });
}

template <typename T, typename I>
void segment_extremum_backward(int64_t n_rows, const I* ptr, const T* x, const T* y, const T* g, int64_t w,
                               T* out, T* ties) {
    // ties: (n_rows, w) scratch.
    for_segments(ptr, n_rows, w, [&](int64_t r0, int64_t r1, auto width) {
        constexpr int kW = decltype(width)::value;
        const int64_t ww = kW ? kW : w;
        constexpr int kAcc = kW ? kW : 1;
        for (int64_t r = r0; r < r1; ++r) {
            const T* __restrict__ yr = y + r * ww;
            const T* __restrict__ gr = g + r * ww;
            T tr_fixed[kAcc];  // registers for fixed widths (see segment_extremum)
            T* __restrict__ tr = kW ? tr_fixed : ties + r * ww;
            const int64_t e0 = ptr[r], e1 = ptr[r + 1];
            for (int64_t k = 0; k < ww; ++k) tr[k] = T(0);
            for (int64_t e = e0; e < e1; ++e) {
                const T* __restrict__ xr = x + e * ww;
#pragma omp simd
                for (int64_t k = 0; k < ww; ++k) tr[k] += (xr[k] == yr[k]) ? T(1) : T(0);
            }
            for (int64_t k = 0; k < ww; ++k) tr[k] = gr[k] / tr[k];  // now the share of each tie
            for (int64_t e = e0; e < e1; ++e) {
                const T* __restrict__ xr = x + e * ww;
                T* __restrict__ o = out + e * ww;
#pragma omp simd
                for (int64_t k = 0; k < ww; ++k) o[k] = (xr[k] == yr[k]) ? tr[k] : tr[k] * T(0);
            }
        }
    });
}

// ---------------------------------------------------------------- products
//
// Forward: y[j] = x[e0] * x[e0+1] * ... (left to right; 1 for an empty segment). Backward: each
// row gets the gradient times the product of the *other* rows of its segment, from prefix and
// suffix products in one sweep each way: out[e] = (x[e0] ... x[e-1]) * (g[j] * x[e+1] ... x[e1-1]).
// No division, so a row next to zeros gets its exact gradient (one zero: the zero row gets g times
// the product of the others, the rest 0; two zeros: all 0) and every output row is written.
//
// The features go through in chunks of C (a compile-time width: the running products live in
// registers): the fixed widths of with_width as one chunk, any other width in chunks of 32, 8, 1.

template <int C, typename T, typename I>
void prod_chunk(int64_t r, const I* __restrict__ ptr, const T* __restrict__ x, int64_t w, int64_t k0,
                T* __restrict__ y) {
    T acc[C];
    for (int k = 0; k < C; ++k) acc[k] = T(1);
    const int64_t e1 = ptr[r + 1];
    for (int64_t e = ptr[r]; e < e1; ++e) {
        const T* __restrict__ xr = x + e * w + k0;
#pragma omp simd
        for (int k = 0; k < C; ++k) acc[k] *= xr[k];
    }
    T* __restrict__ yr = y + r * w + k0;
    for (int k = 0; k < C; ++k) yr[k] = acc[k];
}

template <int C, typename T, typename I>
void prod_backward_chunk(int64_t r, const I* __restrict__ ptr, const T* __restrict__ x, const T* __restrict__ g,
                         int64_t w, int64_t k0, T* __restrict__ out) {
    const int64_t e0 = ptr[r], e1 = ptr[r + 1];
    T acc[C];
    for (int k = 0; k < C; ++k) acc[k] = T(1);
    for (int64_t e = e0; e < e1; ++e) {  // out[e] = the product of the rows before e
        const T* __restrict__ xr = x + e * w + k0;
        T* __restrict__ o = out + e * w + k0;
#pragma omp simd
        for (int k = 0; k < C; ++k) {
            o[k] = acc[k];
            acc[k] *= xr[k];
        }
    }
    const T* __restrict__ gr = g + r * w + k0;
    for (int k = 0; k < C; ++k) acc[k] = gr[k];
    for (int64_t e = e1 - 1; e >= e0; --e) {  // times g and the product of the rows after e
        const T* __restrict__ xr = x + e * w + k0;
        T* __restrict__ o = out + e * w + k0;
#pragma omp simd
        for (int k = 0; k < C; ++k) {
            o[k] *= acc[k];
            acc[k] *= xr[k];
        }
    }
}

template <int C>
struct Chunk {
    static constexpr int value = C;
};

// body(Chunk<C>{}, k0) for the chunks of a row of w features: 32 at a time, then 8, then 1.
template <typename Body>
void for_chunks(int64_t w, Body body) {
    int64_t k0 = 0;
    for (; k0 + 32 <= w; k0 += 32) body(Chunk<32>{}, k0);
    for (; k0 + 8 <= w; k0 += 8) body(Chunk<8>{}, k0);
    for (; k0 < w; ++k0) body(Chunk<1>{}, k0);
}

// body(Chunk<C>{}, k0) for the chunks of a row: one chunk of a fixed width W, else for_chunks's.
template <int W, typename Body>
void for_width_chunks(int64_t w, Body body) {
    if constexpr (W > 0) body(Chunk<W>{}, (int64_t)0);
    else for_chunks(w, body);
}

template <typename T, typename I>
void segment_prod(int64_t n_rows, const I* ptr, const T* x, int64_t w, T* y) {
    for_segments(ptr, n_rows, w, [&](int64_t r0, int64_t r1, auto width) {
        constexpr int kW = decltype(width)::value;
        for (int64_t r = r0; r < r1; ++r)
            for_width_chunks<kW>(w, [&](auto chunk, int64_t k0) {
                prod_chunk<decltype(chunk)::value>(r, ptr, x, w, k0, y);
            });
    });
}

template <typename T, typename I>
void segment_prod_backward(int64_t n_rows, const I* ptr, const T* x, const T* g, int64_t w, T* out) {
    for_segments(ptr, n_rows, w, [&](int64_t r0, int64_t r1, auto width) {
        constexpr int kW = decltype(width)::value;
        for (int64_t r = r0; r < r1; ++r)
            for_width_chunks<kW>(w, [&](auto chunk, int64_t k0) {
                prod_backward_chunk<decltype(chunk)::value>(r, ptr, x, g, w, k0, out);
            });
    });
}

// ---------------------------------------------------------------- tensors

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = std::optional<Tensor>;

void check_values(const Tensor& x, const char* op) {
    TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble),
                "neurovec_cpu::", op, " takes float32 or float64 CPU tensors, got ", x.scalar_type(), " on ",
                x.device());
}

int64_t row_width(const Tensor& x) {
    int64_t w = 1;
    for (int64_t d = 1; d < x.dim(); ++d) w *= x.size(d);
    return w;
}

// x's shape with n rows.
std::vector<int64_t> with_rows(const Tensor& x, int64_t n) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape[0] = n;
    return shape;
}

// t in the given dtype, contiguous: usually t itself (to() would cost a dispatch even then).
Tensor as(const Tensor& t, at::ScalarType dtype) {
    return (t.scalar_type() == dtype ? t : t.to(dtype)).contiguous();
}

// Per-entry values or per-segment divisors in x's dtype; undefined if not given.
Tensor like(const OptionalTensor& t, const Tensor& x) {
    if (!t.has_value() || !t->defined()) return Tensor();
    return as(*t, x.scalar_type());
}

// Whether autograd must record a node for an op on x: else the Autograd kernels below call
// the CPU kernel directly (torch::autograd::Function::apply costs ~1 µs even then).
bool needs_graph(const Tensor& x) {
    return x.requires_grad() && at::GradMode::is_enabled();
}

template <typename T>
const T* data_or_null(const Tensor& t) {
    return t.defined() ? t.data_ptr<T>() : nullptr;
}

// y[j] = sum_{e in ptr[j]..ptr[j+1]} values[e] * x[col[e]] / divide[j]; without col, row e. Into
// out where it is given (a contiguous tensor of y's shape and dtype: its old values are never read,
// or with add, each row plus its sum, one IEEE addition as out.add_(y)), else into a new tensor.
Tensor csr_sum(const Tensor& x_in, const Tensor& ptr_in, const Tensor& col_in, const OptionalTensor& values_in,
               const OptionalTensor& divide_in, const Tensor& out = Tensor(), bool add = false) {
    check_values(x_in, "csr_sum");
    const Tensor x = x_in.contiguous(), ptr = ptr_in.contiguous();
    const Tensor col = col_in.defined() ? as(col_in, ptr.scalar_type()) : Tensor();
    const Tensor values = like(values_in, x), divide = like(divide_in, x);
    const int64_t n = ptr.size(0) - 1;
    Tensor y;
    if (out.defined()) {
        TORCH_CHECK(out.sizes() == at::IntArrayRef(with_rows(x, n)) && out.scalar_type() == x.scalar_type()
                        && out.device() == x.device() && out.is_contiguous(),
                    "neurovec_cpu::csr_sum_out: out must be a contiguous ", x.scalar_type(), " tensor of shape ",
                    at::IntArrayRef(with_rows(x, n)), ", got ", out.sizes(), " ", out.scalar_type());
        TORCH_CHECK(!out.is_same(x) && out.data_ptr() != x.data_ptr(), "neurovec_cpu::csr_sum_out: out is the input");
        y = out;
    } else {
        y = empty_output(with_rows(x, n), x.options());
    }
    const bool prefetch = x.numel() * (int64_t)x.element_size() > kCachedBytes;  // NOTE: [prefetching gathered rows]
        AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::csr_sum", [&] {
        AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "neurovec_cpu::csr_sum", [&] {
            segment_sum<scalar_t, index_t>(n, ptr.data_ptr<index_t>(), data_or_null<index_t>(col),
                                           data_or_null<scalar_t>(values), x.data_ptr<scalar_t>(), row_width(x),
                                           y.data_ptr<scalar_t>(), data_or_null<scalar_t>(divide), prefetch,
                                           add && out.defined());
        });
    });
    return y;
}

// y[j] += bias for every row j, in place: bias is one row of y's row shape. Each element gets
// the same rounding as torch's y + bias (one IEEE addition), so fusing the add changes no bit.
void add_row(Tensor& y, const Tensor& bias_in) {
    TORCH_CHECK(bias_in.scalar_type() == y.scalar_type() && bias_in.sizes() == y.sizes().slice(1),
                "neurovec_cpu::gather_sum: bias must be one row of the result, shape ", y.sizes().slice(1), " and ",
                y.scalar_type(), ", got ", bias_in.sizes(), " and ", bias_in.scalar_type());
    const Tensor bias = bias_in.contiguous();
    const int64_t w = row_width(y);
    AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "neurovec_cpu::add_row", [&] {
        scalar_t* out = y.data_ptr<scalar_t>();
        const scalar_t* b = bias.data_ptr<scalar_t>();
        at::parallel_for(0, y.size(0), std::max<int64_t>(1, 32768 / std::max<int64_t>(w, 1)), [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t k = 0; k < w; ++k) out[r * w + k] += b[k];
        });
    });
}

// A @ x, plus bias (if given) added to each row last.
Tensor csr_sum_biased(const Tensor& x, const Tensor& ptr, const Tensor& col, const OptionalTensor& values,
                      const OptionalTensor& bias) {
    Tensor y = csr_sum(x, ptr, col, values, std::nullopt);
    if (bias.has_value() && bias->defined()) add_row(y, *bias);
    return y;
}

// out[e] = values[e] * g[j] / divide[j] for the entries e of segment j: the transpose of a segment sum.
Tensor broadcast(const Tensor& g_in, const Tensor& ptr_in, const OptionalTensor& values_in,
                 const OptionalTensor& divide_in, int64_t n_entries) {
    check_values(g_in, "segment_broadcast");
    const Tensor g = g_in.contiguous(), ptr = ptr_in.contiguous();
    const Tensor values = like(values_in, g), divide = like(divide_in, g);
    Tensor out = empty_output(with_rows(g, n_entries), g.options());
        AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "neurovec_cpu::segment_broadcast", [&] {
        AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "neurovec_cpu::segment_broadcast", [&] {
            segment_broadcast<scalar_t, index_t>(ptr.size(0) - 1, ptr.data_ptr<index_t>(),
                                                 data_or_null<scalar_t>(values), g.data_ptr<scalar_t>(),
                                                 row_width(g), out.data_ptr<scalar_t>(),
                                                 data_or_null<scalar_t>(divide));
        });
    });
    return out;
}

Tensor extremum(const Tensor& x_in, const Tensor& ptr_in, bool max) {
    check_values(x_in, max ? "segment_max" : "segment_min");
    const Tensor x = x_in.contiguous(), ptr = ptr_in.contiguous();
    const int64_t n = ptr.size(0) - 1;
    Tensor y = empty_output(with_rows(x, n), x.options());
        AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::segment_extremum", [&] {
        AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "neurovec_cpu::segment_extremum", [&] {
            const index_t* p = ptr.data_ptr<index_t>();
            if (max) segment_extremum<true, scalar_t, index_t>(n, p, nullptr, x.data_ptr<scalar_t>(), row_width(x),
                                                                y.data_ptr<scalar_t>());
            else segment_extremum<false, scalar_t, index_t>(n, p, nullptr, x.data_ptr<scalar_t>(), row_width(x),
                                                            y.data_ptr<scalar_t>());
        });
    });
    return y;
}

// y[j] = the product of the rows of segment j (1 for an empty one).
Tensor prod(const Tensor& x_in, const Tensor& ptr_in) {
    check_values(x_in, "segment_prod");
    const Tensor x = x_in.contiguous(), ptr = ptr_in.contiguous();
    const int64_t n = ptr.size(0) - 1;
    Tensor y = empty_output(with_rows(x, n), x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::segment_prod", [&] {
        AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "neurovec_cpu::segment_prod", [&] {
            segment_prod<scalar_t, index_t>(n, ptr.data_ptr<index_t>(), x.data_ptr<scalar_t>(), row_width(x),
                                            y.data_ptr<scalar_t>());
        });
    });
    return y;
}

// The gradient of a segment product: each row gets grad times the product of its segment's other rows.
Tensor prod_backward(const Tensor& grad_in, const Tensor& x_in, const Tensor& ptr_in) {
    check_values(x_in, "segment_prod_backward");
    const Tensor x = x_in.contiguous(), ptr = ptr_in.contiguous();
    const Tensor grad = as(grad_in, x.scalar_type());
    TORCH_CHECK(grad.size(0) == ptr.size(0) - 1 && row_width(grad) == row_width(x),
                "neurovec_cpu::prod_backward: grad must have one row per segment, of x's row shape");
    Tensor out = empty_output_like(x);  // every row is written
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::segment_prod_backward", [&] {
        AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "neurovec_cpu::segment_prod_backward", [&] {
            segment_prod_backward<scalar_t, index_t>(ptr.size(0) - 1, ptr.data_ptr<index_t>(), x.data_ptr<scalar_t>(),
                                                     grad.data_ptr<scalar_t>(), row_width(x),
                                                     out.data_ptr<scalar_t>());
        });
    });
    return out;
}

// Two-row products, y[j] = a[j] * b[j], where x holds the rows a and b as (2, n, ...) ("strided":
// a = x[:n], b = x[n:]) or as (n, 2, ...) (a = x[0::2], b = x[1::2]). Its backward writes both
// gradients into one fresh block, once: out_a = g * b, out_b = g * a (the floats of torch's mul
// backward), where torch's v[0] * v[1] zero-fills a block per row and adds them.
struct PairLayout {
    int64_t a, b, step;  // element offsets of row j's a and b: j * step + a, j * step + b
};

PairLayout pair_layout(int64_t n, int64_t w, bool strided) {
    return strided ? PairLayout{0, n * w, w} : PairLayout{0, w, 2 * w};
}

template <typename T>
void pair_prod_rows(int64_t r0, int64_t r1, const T* __restrict__ xp, PairLayout at_, int64_t w,
                    T* __restrict__ yp) {
    for (int64_t j = r0; j < r1; ++j) {
        const T* __restrict__ a = xp + j * at_.step + at_.a;
        const T* __restrict__ b = xp + j * at_.step + at_.b;
        T* __restrict__ o = yp + j * w;
#pragma omp simd
        for (int64_t k = 0; k < w; ++k) o[k] = a[k] * b[k];
    }
}

template <typename T>
void pair_prod_backward_rows(int64_t r0, int64_t r1, const T* __restrict__ xp, const T* __restrict__ gp,
                             PairLayout at_, int64_t w, T* __restrict__ op) {
    for (int64_t j = r0; j < r1; ++j) {
        const int64_t ia = j * at_.step + at_.a, ib = j * at_.step + at_.b;
        const T* __restrict__ g = gp + j * w;
#pragma omp simd
        for (int64_t k = 0; k < w; ++k) {
            const T a = xp[ia + k], b = xp[ib + k];
            op[ia + k] = g[k] * b;
            op[ib + k] = g[k] * a;
        }
    }
}

int64_t pair_grain(int64_t w) {
    return std::max<int64_t>(1, kParallelWork / std::max<int64_t>(w, 1));
}

Tensor pair_prod(const Tensor& x_in, bool strided) {
    check_values(x_in, "pair_prod");
    TORCH_CHECK(x_in.dim() >= 1 && x_in.size(0) % 2 == 0, "neurovec_cpu::pair_prod: x needs an even number of rows");
    const Tensor x = x_in.contiguous();
    const int64_t n = x.size(0) / 2, w = row_width(x);
    Tensor y = empty_output(with_rows(x, n), x.options());
    const PairLayout at_ = pair_layout(n, w, strided);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::pair_prod", [&] {
        const scalar_t* xp = x.data_ptr<scalar_t>();
        scalar_t* yp = y.data_ptr<scalar_t>();
        at::parallel_for(0, n, pair_grain(w), [&](int64_t r0, int64_t r1) {
            pair_prod_rows<scalar_t>(r0, r1, xp, at_, w, yp);
        });
    });
    return y;
}

Tensor pair_prod_backward(const Tensor& grad_in, const Tensor& x_in, bool strided) {
    check_values(x_in, "pair_prod_backward");
    const Tensor x = x_in.contiguous();
    const Tensor grad = as(grad_in, x.scalar_type());
    const int64_t n = x.size(0) / 2, w = row_width(x);
    TORCH_CHECK(grad.size(0) == n && row_width(grad) == w,
                "neurovec_cpu::pair_prod_backward: grad must have half of x's rows, of x's row shape");
    Tensor out = empty_output_like(x);  // every element is written
    const PairLayout at_ = pair_layout(n, w, strided);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::pair_prod_backward", [&] {
        const scalar_t* xp = x.data_ptr<scalar_t>();
        const scalar_t* gp = grad.data_ptr<scalar_t>();
        scalar_t* op = out.data_ptr<scalar_t>();
        at::parallel_for(0, n, pair_grain(w), [&](int64_t r0, int64_t r1) {
            pair_prod_backward_rows<scalar_t>(r0, r1, xp, gp, at_, w, op);
        });
    });
    return out;
}

// y[r] = x[index[r]]: the rows of x a gather reads, copied (index_select's forward without its
// autograd, for gathers from constants). torch's index_select took twice as long on a million random
// rows of 16 floats (1 thread, loaded, CPU time: 19 against 9 ms), the fixed-width copy below
// compiles to a few vector moves per row.
template <typename T, typename I, typename WT>
void copy_rows(int64_t r0, int64_t r1, const I* __restrict__ index, const T* __restrict__ x, int64_t w_any,
               T* __restrict__ y) {
    constexpr int kW = WT::value;
    const int64_t w = kW ? kW : w_any;
    for (int64_t r = r0; r < r1; ++r) {
        const T* __restrict__ xr = x + (int64_t)index[r] * w;
        T* __restrict__ yr = y + r * w;
#pragma omp simd
        for (int64_t k = 0; k < w; ++k) yr[k] = xr[k];
    }
}

Tensor rows(const Tensor& x_in, const Tensor& index_in) {
    check_values(x_in, "rows");
    TORCH_CHECK(index_in.dim() == 1, "neurovec_cpu::rows: index must be one-dimensional");
    const Tensor x = x_in.contiguous(), index = index_in.contiguous();
    const int64_t n = index.size(0), w = row_width(x);
    Tensor y = empty_output(with_rows(x, n), x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::rows", [&] {
        AT_DISPATCH_INDEX_TYPES(index.scalar_type(), "neurovec_cpu::rows", [&] {
            const index_t* ip = index.data_ptr<index_t>();
            const scalar_t* xp = x.data_ptr<scalar_t>();
            scalar_t* yp = y.data_ptr<scalar_t>();
            at::parallel_for(0, n, pair_grain(w), [&](int64_t r0, int64_t r1) {
                with_width(w, [&](auto width) { copy_rows<scalar_t, index_t, decltype(width)>(r0, r1, ip, xp, w, yp); });
            });
        });
    });
    return y;
}

// The weights' gradient of a chunked product read by a gather sum (engines/runtime.py, NOTE: [a
// chunked product's weights' gradient from its readers]): x (chunks * C, i) in chunks of C rows, one
// weight (o, i) per chunk, the products (chunks * C, o) summed into the rows of grad (n, o) by a CSR
// whose transpose is (t_ptr, t_col, t_values). out[k] = g_k^T x_k, where g_k (C, o) are the products'
// gradients of chunk k: the transposed gather sum of grad, as gather_sum's backward computes them, but
// into a buffer of one chunk that stays in cache, not into a (chunks * C, o) tensor written and read again.
Tensor chunk_weight_grad(const Tensor& grad_in, const Tensor& t_ptr_in, const Tensor& t_col_in,
                         const OptionalTensor& t_values_in, const Tensor& x_in, int64_t chunks) {
    check_values(grad_in, "chunk_weight_grad");
    const Tensor grad = grad_in.contiguous(), x = as(x_in, grad.scalar_type()), t_ptr = t_ptr_in.contiguous();
    const Tensor t_col = as(t_col_in, t_ptr.scalar_type()), t_values = like(t_values_in, grad);
    TORCH_CHECK(grad.dim() == 2 && x.dim() == 2 && chunks > 0 && x.size(0) % chunks == 0 &&
                t_ptr.size(0) == x.size(0) + 1,
                "neurovec_cpu::chunk_weight_grad: grad (n, o), x (chunks * C, i) and a transposed CSR over x's "
                "rows expected, got grad ", grad.sizes(), ", x ", x.sizes(), ", t_ptr ", t_ptr.sizes(), ", chunks ",
                chunks);
    const int64_t o = grad.size(1), i = x.size(1), size = x.size(0) / chunks;
    Tensor out = at::empty({chunks, o, i}, grad.options());
    const bool prefetch = grad.numel() * (int64_t)grad.element_size() > kCachedBytes;
    AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "neurovec_cpu::chunk_weight_grad", [&] {
        AT_DISPATCH_INDEX_TYPES(t_ptr.scalar_type(), "neurovec_cpu::chunk_weight_grad", [&] {
            const index_t* ptr = t_ptr.data_ptr<index_t>();
            const index_t* col = t_col.data_ptr<index_t>();
            const scalar_t* val = data_or_null<scalar_t>(t_values);
            const scalar_t* g = grad.data_ptr<scalar_t>();
            at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
                Tensor buffer = at::empty({size, o}, grad.options());
                scalar_t* b = buffer.data_ptr<scalar_t>();
                for (int64_t k = k0; k < k1; ++k) {
                    // Rows k * size ... of the products: sum_rows over a CSR whose first row is k * size.
                    const index_t* p = ptr + k * size;
                    with_width(o, [&](auto width) {
                        using WT = decltype(width);
                        if (val) sum_rows<scalar_t, index_t, WT, true, true>(0, size, p, col, val, g, o, b, nullptr, prefetch);
                        else sum_rows<scalar_t, index_t, WT, true, false>(0, size, p, col, val, g, o, b, nullptr, prefetch);
                    });
                    Tensor target = out.select(0, k);
                    at::mm_out(target, buffer.t(), x.narrow(0, k * size, size));
                }
            });
        });
    });
    return out;
}

// NOTE: [a chunked product of gathered rows] A relational layer whose inputs have a gradient (hetero-100's
// second layer) multiplies gathered rows: product p is w[p / C] (o, i) times row p of x = A source, a gather
// sum of the source's rows (246,805 of 16 into 1,035,166 rows in chunk order). Materialised, those rows are a
// (rows, i) tensor (66 MB) written by the gather and read once by a batched GEMM. Here each thread sums the
// rows of one chunk at a time into a buffer that stays in cache (sum_rows, as csr_sum does) and multiplies
// them there (gathered_chunk_product, y = rows times w_k^T; threads own disjoint chunks). The backward
// (gathered_chunk_backward, below) reads the source once more, row by row, for both gradients.

// The rows of chunk k of A source, summed into buffer (size, i): sum_rows over a CSR whose first row is k * size.
template <typename T, typename I>
void chunk_rows(int64_t k, int64_t size, const I* ptr, const I* col, const T* val, const T* x, int64_t i, T* buffer,
                bool prefetch) {
    const I* p = ptr + k * size;
    with_width(i, [&](auto width) {
        using WT = decltype(width);
        if (val) sum_rows<T, I, WT, true, true>(0, size, p, col, val, x, i, buffer, nullptr, prefetch);
        else sum_rows<T, I, WT, true, false>(0, size, p, col, val, x, i, buffer, nullptr, prefetch);
    });
}

// y (size, O) = rows (size, I) times wt (I, O), wt a chunk's weight transposed: each row's O sums in registers,
// one feature of the row at a time (acc += x[f] * wt[f], O wide: a vector FMA with the feature broadcast), both
// widths fixed so that the loops unroll. Each sum adds its I products in feature order.
template <int O, int I, typename T>
void rows_times_weight(int64_t size, const T* __restrict__ rows, const T* __restrict__ wt, T* __restrict__ y) {
    for (int64_t r = 0; r < size; ++r) {
        const T* __restrict__ xr = rows + r * I;
        T acc[O];
#pragma omp simd
        for (int c = 0; c < O; ++c) acc[c] = T(0);
        for (int f = 0; f < I; ++f) {
            const T v = xr[f];
            const T* __restrict__ wf = wt + f * O;
#pragma omp simd
            for (int c = 0; c < O; ++c) acc[c] += v * wf[c];
        }
        T* __restrict__ yr = y + r * O;
#pragma omp simd
        for (int c = 0; c < O; ++c) yr[c] = acc[c];
    }
}

// Whether rows_times_weight has a case for these widths (else a chunk is one at::mm).
bool fixed_widths(int64_t o, int64_t i) {
    return (i == 16 || i == 32) && (o == 4 || o == 8 || o == 16 || o == 32);
}

// rows_times_weight with the widths fixed_widths names.
template <typename T>
void chunk_times_weight(int64_t size, const T* rows, const T* wt, T* y, int64_t o, int64_t i) {
    auto run = [&](auto oc, auto ic) {
        rows_times_weight<decltype(oc)::value, decltype(ic)::value, T>(size, rows, wt, y);
    };
    auto with_o = [&](auto ic) {
        if (o == 4) run(Width<4>{}, ic);
        else if (o == 8) run(Width<8>{}, ic);
        else if (o == 16) run(Width<16>{}, ic);
        else run(Width<32>{}, ic);
    };
    if (i == 16) with_o(Width<16>{});
    else with_o(Width<32>{});
}

// NOTE: [a chunked product in C++] A chunked product of a value with no gradient (hetero-100's first layer:
// its folded inputs, 1,035,166 rows of 16, times 223 weights of 16 x 16) is one batched GEMM, whose narrow
// shapes MKL runs at a fraction of the machine's speed. Where fixed_widths has the widths, chunk_product runs
// rows_times_weight on each chunk instead (threads own disjoint chunks); elsewhere one at::mm per chunk.
Tensor chunk_product(const Tensor& x_in, const Tensor& w_in, int64_t chunks) {
    check_values(x_in, "chunk_product");
    const Tensor x = x_in.contiguous().detach(), w = as(w_in, x.scalar_type()).detach();
    TORCH_CHECK(x.dim() == 2 && w.dim() == 3 && w.size(0) == chunks && chunks > 0 && x.size(0) % chunks == 0 &&
                w.size(2) == x.size(1),
                "neurovec_cpu::chunk_product: x (chunks * C, i) and w (chunks, o, i) expected, got x ", x.sizes(),
                ", w ", w.sizes(), ", chunks ", chunks);
    const int64_t o = w.size(1), i = x.size(1), size = x.size(0) / chunks;
    Tensor y = empty_output({x.size(0), o}, x.options());
    const Tensor wt = w.transpose(1, 2).contiguous();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::chunk_product", [&] {
        at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
            for (int64_t k = k0; k < k1; ++k) {
                if (fixed_widths(o, i)) {
                    chunk_times_weight<scalar_t>(size, x.data_ptr<scalar_t>() + k * size * i,
                                                 wt.data_ptr<scalar_t>() + k * o * i,
                                                 y.data_ptr<scalar_t>() + k * size * o, o, i);
                } else {
                    Tensor target = y.narrow(0, k * size, size);
                    at::mm_out(target, x.narrow(0, k * size, size), w.select(0, k).t());
                }
            }
        });
    });
    return y;
}

struct GatheredChunks {
    Tensor x, ptr, col, values;
    int64_t chunks, size, i;
    bool prefetch;
};

GatheredChunks gathered_chunks(const Tensor& x_in, const Tensor& ptr_in, const Tensor& col_in,
                               const OptionalTensor& values_in, int64_t chunks, const char* op) {
    check_values(x_in, op);
    GatheredChunks g;
    g.x = x_in.contiguous();
    g.ptr = ptr_in.contiguous();
    g.col = as(col_in, g.ptr.scalar_type());
    g.values = like(values_in, g.x);
    const int64_t rows = g.ptr.size(0) - 1;
    TORCH_CHECK(g.x.dim() == 2 && chunks > 0 && rows % chunks == 0 && rows > 0,
                "neurovec_cpu::", op, ": x (n, i) and a CSR of chunks * C rows over x's rows expected, got x ",
                g.x.sizes(), ", ptr ", g.ptr.sizes(), ", chunks ", chunks);
    g.chunks = chunks;
    g.size = rows / chunks;
    g.i = g.x.size(1);
    g.prefetch = g.x.numel() * (int64_t)g.x.element_size() > kCachedBytes;
    return g;
}

// y (chunks * C, o): row p is w[p / C] times row p of A x (NOTE: [a chunked product of gathered rows]).
Tensor gathered_chunk_product(const Tensor& x_in, const Tensor& ptr_in, const Tensor& col_in,
                              const OptionalTensor& values_in, const Tensor& w_in, int64_t chunks) {
    const GatheredChunks g = gathered_chunks(x_in, ptr_in, col_in, values_in, chunks, "gathered_chunk_product");
    const Tensor w = as(w_in, g.x.scalar_type()).detach();  // for at::mm_out, which refuses inputs with a gradient
    TORCH_CHECK(w.dim() == 3 && w.size(0) == chunks && w.size(2) == g.i,
                "neurovec_cpu::gathered_chunk_product: w (chunks, o, i) expected, got ", w.sizes(), " for x ",
                g.x.sizes(), " and ", chunks, " chunks");
    const int64_t o = w.size(1), size = g.size, i = g.i;
    Tensor y = empty_output({chunks * size, o}, g.x.options());
    AT_DISPATCH_FLOATING_TYPES(g.x.scalar_type(), "neurovec_cpu::gathered_chunk_product", [&] {
        AT_DISPATCH_INDEX_TYPES(g.ptr.scalar_type(), "neurovec_cpu::gathered_chunk_product", [&] {
            const index_t* ptr = g.ptr.data_ptr<index_t>();
            const index_t* col = g.col.data_ptr<index_t>();
            const scalar_t* val = data_or_null<scalar_t>(g.values);
            const scalar_t* xp = g.x.data_ptr<scalar_t>();
            const Tensor wt_all = w.transpose(1, 2).contiguous();  // (chunks, i, o)
            const scalar_t* wp = wt_all.data_ptr<scalar_t>();
            scalar_t* yp = y.data_ptr<scalar_t>();
            const bool fixed = fixed_widths(o, i);
            at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
                Tensor buffer = at::empty({size, i}, g.x.options());
                scalar_t* b = buffer.data_ptr<scalar_t>();
                for (int64_t k = k0; k < k1; ++k) {
                    chunk_rows<scalar_t, index_t>(k, size, ptr, col, val, xp, i, b, g.prefetch);
                    scalar_t* yk = yp + k * size * o;
                    const scalar_t* wk = wp + k * o * i;
                    if (fixed) {
                        chunk_times_weight<scalar_t>(size, b, wk, yk, o, i);
                    } else {
                        Tensor target = y.narrow(0, k * size, size);
                        at::mm_out(target, buffer, w.select(0, k).t());
                    }
                }
            });
        });
    });
    return y;
}

// Accumulates g_p's row times w_k into acc (i values): the width a template argument where with_width has
// it, so that acc stays in registers.
template <int KI, typename T, bool WEIGHTED>
inline void add_product_row(T* __restrict__ acc, const T* __restrict__ gp, const T* __restrict__ wk, int64_t o,
                            int64_t i, T v) {
    for (int64_t c = 0; c < o; ++c) {
        const T s = WEIGHTED ? v * gp[c] : gp[c];
        const T* __restrict__ wr = wk + c * (KI ? KI : i);
#pragma omp simd
        for (int64_t f = 0; f < (KI ? KI : i); ++f) acc[f] += s * wr[f];
    }
}

constexpr int64_t kPrefetchProducts = 16;

// Both gradients of gathered_chunk_product (NOTE: [a chunked product of gathered rows]) in one pass over the
// transposed CSR (t_ptr, t_col, t_values): for entry e of source row j, product p = t_col[e] of chunk
// k = p / C and value v, the source's gradient gets v w_k^T g_p (each product's o-wide gradient read where it
// is needed, never a (rows, i) tensor of g_p w_k written and read back) and the weights'
// gradient of chunk k gets (v g_p) x_j^T, the outer product of the product's gradient and the source row, which
// is read once, in order, where the rows of the chunks would be gathered from it again. Each thread adds into
// a (chunks, o, i) block of its own (a weight's size: in cache), summed at the end.
template <typename T, typename I, typename WT, bool WEIGHTED>
void gathered_backward_rows(int64_t r0, int64_t r1, const I* __restrict__ ptr, const I* __restrict__ col,
                            const T* __restrict__ val, const T* __restrict__ g, const T* __restrict__ w,
                            const T* __restrict__ x, int64_t o, int64_t i_any, int64_t size, T* __restrict__ out,
                            T* __restrict__ gw) {
    constexpr int kI = WT::value;
    const int64_t i = kI ? kI : i_any;
    const int64_t end = ptr[r1];
    for (int64_t r = r0; r < r1; ++r) {
        T local[kI ? kI : 1];
        T* __restrict__ acc = out ? (kI ? local : out + r * i) : nullptr;
        if (acc) for (int64_t f = 0; f < i; ++f) acc[f] = T(0);
        const T* __restrict__ xr = x + r * i;
        const int64_t e1 = ptr[r + 1];
        for (int64_t e = ptr[r]; e < e1; ++e) {
            if (e + kPrefetchProducts < end) __builtin_prefetch(g + (int64_t)col[e + kPrefetchProducts] * o, 0, 3);
            const int64_t p = col[e];
            const T v = WEIGHTED ? val[e] : T(1);
            const T* __restrict__ gp = g + p * o;
            if (acc) add_product_row<kI, T, WEIGHTED>(acc, gp, w + (p / size) * o * i, o, i, v);
            if (gw) {
                T* __restrict__ gk = gw + (p / size) * o * i;
                for (int64_t c = 0; c < o; ++c) {
                    const T s = WEIGHTED ? v * gp[c] : gp[c];
                    T* __restrict__ gr = gk + c * i;
#pragma omp simd
                    for (int64_t f = 0; f < i; ++f) gr[f] += s * xr[f];
                }
            }
        }
        if constexpr (kI != 0) {
            if (acc) {
                T* __restrict__ y = out + r * i;
                for (int f = 0; f < kI; ++f) y[f] = local[f];
            }
        }
    }
}

std::tuple<Tensor, Tensor> gathered_chunk_backward(const Tensor& grad_in, const Tensor& x_in, const Tensor& w_in,
                                                   const Tensor& t_ptr_in, const Tensor& t_col_in,
                                                   const OptionalTensor& t_values_in, bool source_grad,
                                                   bool weight_grad) {
    check_values(grad_in, "gathered_chunk_backward");
    const Tensor grad = grad_in.contiguous(), x = as(x_in, grad.scalar_type()), w = as(w_in, grad.scalar_type());
    const Tensor t_ptr = t_ptr_in.contiguous(), t_col = as(t_col_in, t_ptr.scalar_type());
    const Tensor t_values = like(t_values_in, grad);
    TORCH_CHECK(grad.dim() == 2 && w.dim() == 3 && x.dim() == 2 && w.size(1) == grad.size(1) &&
                w.size(2) == x.size(1) && grad.size(0) % w.size(0) == 0 && t_ptr.size(0) == x.size(0) + 1,
                "neurovec_cpu::gathered_chunk_backward: grad (chunks * C, o), x (n, i), w (chunks, o, i) and a "
                "transposed CSR over x's rows expected, got grad ", grad.sizes(), ", x ", x.sizes(), ", w ",
                w.sizes(), ", t_ptr ", t_ptr.sizes());
    const int64_t n = x.size(0), chunks = w.size(0), o = w.size(1), i = w.size(2), size = grad.size(0) / chunks;
    Tensor out = source_grad ? empty_output({n, i}, grad.options()) : at::empty({0}, grad.options());
    const int64_t work = (int64_t)t_ptr[n].item<int64_t>() * i * o;
    const int n_threads = (at::get_num_threads() > 1 && work >= kParallelWork && n >= 2) ? at::get_num_threads() : 1;
    Tensor partial = at::zeros({weight_grad ? n_threads : 0, chunks, o, i}, grad.options());
    AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "neurovec_cpu::gathered_chunk_backward", [&] {
        AT_DISPATCH_INDEX_TYPES(t_ptr.scalar_type(), "neurovec_cpu::gathered_chunk_backward", [&] {
            const index_t* ptr = t_ptr.data_ptr<index_t>();
            const index_t* col = t_col.data_ptr<index_t>();
            const scalar_t* val = data_or_null<scalar_t>(t_values);
            scalar_t* outp = source_grad ? out.data_ptr<scalar_t>() : nullptr;
            auto run = [&](int64_t r0, int64_t r1, int64_t t) {
                scalar_t* gw = weight_grad ? partial.data_ptr<scalar_t>() + t * chunks * o * i : nullptr;
                with_width(i, [&](auto width) {
                    using WT = decltype(width);
                    if (val) gathered_backward_rows<scalar_t, index_t, WT, true>(r0, r1, ptr, col, val,
                        grad.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), o, i, size, outp, gw);
                    else gathered_backward_rows<scalar_t, index_t, WT, false>(r0, r1, ptr, col, val,
                        grad.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), o, i, size, outp, gw);
                });
            };
            if (n_threads == 1) {
                run(0, n, 0);
            } else {
                at::parallel_for(0, n_threads, 1, [&](int64_t t0, int64_t t1) {
                    for (int64_t t = t0; t < t1; ++t)
                        run(split_point(ptr, n, (int)t, n_threads), split_point(ptr, n, (int)t + 1, n_threads), t);
                });
            }
        });
    });
    Tensor grad_w = !weight_grad ? at::empty({0}, grad.options()) : n_threads == 1 ? partial.select(0, 0)
                                                                                   : partial.sum(0);
    return {out, grad_w};
}

// The gradient of a segment max / min: ties share it (mask * (grad / ties)[segment]).
Tensor extremum_backward(const Tensor& grad_in, const Tensor& x_in, const Tensor& y_in, const Tensor& ptr_in) {
    check_values(x_in, "segment_extremum_backward");
    const Tensor x = x_in.contiguous(), y = y_in.contiguous(), ptr = ptr_in.contiguous();
    const Tensor grad = as(grad_in, x.scalar_type());
    Tensor out = empty_output_like(x), ties = at::empty_like(y);  // ties: scratch for widths without registers
        AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::segment_extremum_backward", [&] {
        AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "neurovec_cpu::segment_extremum_backward", [&] {
            segment_extremum_backward<scalar_t, index_t>(ptr.size(0) - 1, ptr.data_ptr<index_t>(),
                                                         x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                                         grad.data_ptr<scalar_t>(), row_width(x),
                                                         out.data_ptr<scalar_t>(), ties.data_ptr<scalar_t>());
        });
    });
    return out;
}

// The same formula in differentiable torch ops (double backward: the mask is a constant).
Tensor extremum_backward_differentiable(const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& ptr) {
    const Tensor counts = ptr.diff().to(at::kLong);
    const int64_t n_entries = x.size(0);
    const Tensor mask = at::eq(x.detach(), y.detach().repeat_interleave(counts, 0, n_entries)).to(grad.scalar_type());
    const Tensor ties = at::segment_reduce(mask, "sum", std::nullopt, std::nullopt, ptr.to(at::kLong), 0, true);
    return at::mul(at::div(grad, ties).repeat_interleave(counts, 0, n_entries), mask);
}

// ---------------------------------------------------------------- autograd
//
// The index tensors are constants of the compiled module: they are kept in saved_data
// (no version checks), never differentiated. Each backward is the transposed kernel;
// under create_graph (grad mode on in the backward) it goes through apply() again, so
// it is differentiable in turn.

struct GatherSum : public torch::autograd::Function<GatherSum> {
    static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& ptr, const Tensor& col,
                          const OptionalTensor& values, const Tensor& t_ptr, const Tensor& t_col,
                          const OptionalTensor& t_values, const OptionalTensor& bias) {
        auto& saved = ctx->saved_data;
        saved["ptr"] = ptr, saved["col"] = col, saved["values"] = values;
        saved["t_ptr"] = t_ptr, saved["t_col"] = t_col, saved["t_values"] = t_values;
        // needs_input_grad counts the tensor inputs that are given: the bias's position
        // among them (x, ptr, col, t_ptr, t_col and values/t_values where defined), -1 if none.
        const auto given = [](const OptionalTensor& t) { return int64_t(t.has_value() && t->defined()); };
        saved["bias_edge"] = given(bias) ? 5 + given(values) + given(t_values) : int64_t(-1);
        return csr_sum_biased(x, ptr, col, values, bias);
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        Tensor grad_x;
        if (ctx->needs_input_grad(0) && grads[0].defined()) {
            auto& saved = ctx->saved_data;
            const Tensor t_ptr = saved["t_ptr"].toTensor(), t_col = saved["t_col"].toTensor();
            const OptionalTensor t_values = saved["t_values"].toOptional<Tensor>();
            if (at::GradMode::is_enabled())
                grad_x = apply(grads[0], t_ptr, t_col, t_values, saved["ptr"].toTensor(), saved["col"].toTensor(),
                               saved["values"].toOptional<Tensor>(), std::nullopt);
            else
                grad_x = csr_sum(grads[0], t_ptr, t_col, t_values, std::nullopt);
        }
        // The bias is added to every row: its gradient is the sum of the rows' gradients
        // (a differentiable at::sum, so double backward goes through it too).
        Tensor grad_bias;
        const int64_t bias_edge = ctx->saved_data["bias_edge"].toInt();
        if (bias_edge >= 0 && ctx->needs_input_grad(bias_edge) && grads[0].defined()) grad_bias = grads[0].sum(0);
        return {grad_x, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), grad_bias};
    }
};

struct SegmentBroadcast;

struct SegmentSum : public torch::autograd::Function<SegmentSum> {
    static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& ptr, const OptionalTensor& values,
                          const OptionalTensor& divide) {
        auto& saved = ctx->saved_data;
        saved["ptr"] = ptr, saved["values"] = values, saved["divide"] = divide, saved["n_entries"] = x.size(0);
        return csr_sum(x, ptr, Tensor(), values, divide);
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads);
};

struct SegmentBroadcast : public torch::autograd::Function<SegmentBroadcast> {
    static Tensor forward(AutogradContext* ctx, const Tensor& g, const Tensor& ptr, const OptionalTensor& values,
                          const OptionalTensor& divide, int64_t n_entries) {
        auto& saved = ctx->saved_data;
        saved["ptr"] = ptr, saved["values"] = values, saved["divide"] = divide;
        return broadcast(g, ptr, values, divide, n_entries);
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        Tensor grad_g;
        if (ctx->needs_input_grad(0) && grads[0].defined()) {
            auto& saved = ctx->saved_data;
            const Tensor ptr = saved["ptr"].toTensor();
            const OptionalTensor values = saved["values"].toOptional<Tensor>(), divide = saved["divide"].toOptional<Tensor>();
            grad_g = at::GradMode::is_enabled() ? SegmentSum::apply(grads[0], ptr, values, divide)
                                                : csr_sum(grads[0], ptr, Tensor(), values, divide);
        }
        return {grad_g, Tensor(), Tensor(), Tensor(), Tensor()};
    }
};

variable_list SegmentSum::backward(AutogradContext* ctx, variable_list grads) {
    Tensor grad_x;
    if (ctx->needs_input_grad(0) && grads[0].defined()) {
        auto& saved = ctx->saved_data;
        const Tensor ptr = saved["ptr"].toTensor();
        const OptionalTensor values = saved["values"].toOptional<Tensor>(), divide = saved["divide"].toOptional<Tensor>();
        const int64_t n_entries = saved["n_entries"].toInt();
        grad_x = at::GradMode::is_enabled() ? SegmentBroadcast::apply(grads[0], ptr, values, divide, n_entries)
                                            : broadcast(grads[0], ptr, values, divide, n_entries);
    }
    return {grad_x, Tensor(), Tensor(), Tensor()};
}

struct SegmentExtremum : public torch::autograd::Function<SegmentExtremum> {
    static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& ptr, bool max) {
        Tensor y = extremum(x, ptr, max);
        ctx->save_for_backward({x, y});
        ctx->saved_data["ptr"] = ptr;
        return y;
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        Tensor grad_x;
        if (ctx->needs_input_grad(0) && grads[0].defined()) {
            const variable_list saved = ctx->get_saved_variables();
            const Tensor ptr = ctx->saved_data["ptr"].toTensor();
            grad_x = at::GradMode::is_enabled() ? extremum_backward_differentiable(grads[0], saved[0], saved[1], ptr)
                                                : extremum_backward(grads[0], saved[0], saved[1], ptr);
        }
        return {grad_x, Tensor(), Tensor()};
    }
};

// ---------------------------------------------------------------- registration

// csr_sum: a gather sum where col is given, else a segment sum (or mean, with divide), plus a bias row.
Tensor csr_sum_op(const Tensor& x, const Tensor& ptr, const OptionalTensor& col, const OptionalTensor& values,
                  const OptionalTensor& divide, const OptionalTensor& bias) {
    Tensor y = csr_sum(x, ptr, col.has_value() ? *col : Tensor(), values, divide);
    if (bias.has_value() && bias->defined()) add_row(y, *bias);
    return y;
}

// csr_sum into out, or with add added to it (NOTE: [a pool of gather sums' outputs] in engines/runtime.py).
void csr_sum_out_op(const Tensor& x, const Tensor& ptr, const OptionalTensor& col, const OptionalTensor& values,
                    const OptionalTensor& divide, const OptionalTensor& bias, const Tensor& out, bool add) {
    Tensor y = csr_sum(x, ptr, col.has_value() ? *col : Tensor(), values, divide, out, add);
    if (bias.has_value() && bias->defined()) add_row(y, *bias);
}

Tensor gather_sum_cpu(const Tensor& x, const Tensor& ptr, const Tensor& col, const OptionalTensor& values,
                      const Tensor& t_ptr, const Tensor& t_col, const OptionalTensor& t_values,
                      const OptionalTensor& bias) {
    return csr_sum_biased(x, ptr, col, values, bias);
}

Tensor gather_sum_autograd(const Tensor& x, const Tensor& ptr, const Tensor& col, const OptionalTensor& values,
                           const Tensor& t_ptr, const Tensor& t_col, const OptionalTensor& t_values,
                           const OptionalTensor& bias) {
    const bool bias_graph = bias.has_value() && bias->defined() && needs_graph(*bias);
    if (!needs_graph(x) && !bias_graph) return csr_sum_biased(x, ptr, col, values, bias);
    return GatherSum::apply(x, ptr, col, values, t_ptr, t_col, t_values, bias);
}

Tensor segment_sum_cpu(const Tensor& x, const Tensor& ptr, const OptionalTensor& values,
                       const OptionalTensor& divide) {
    return csr_sum(x, ptr, Tensor(), values, divide);
}

Tensor segment_sum_autograd(const Tensor& x, const Tensor& ptr, const OptionalTensor& values,
                            const OptionalTensor& divide) {
    if (!needs_graph(x)) return csr_sum(x, ptr, Tensor(), values, divide);
    return SegmentSum::apply(x, ptr, values, divide);
}

Tensor segment_extremum_autograd(const Tensor& x, const Tensor& ptr, bool max) {
    if (!needs_graph(x)) return extremum(x, ptr, max);
    return SegmentExtremum::apply(x, ptr, max);
}

}  // namespace

TORCH_LIBRARY(neurovec_cpu, m) {
    // The kernels, no autograd (fake kernels: engines/native.py).
    m.def("csr_sum(Tensor x, Tensor ptr, Tensor? col, Tensor? values, Tensor? divide, Tensor? bias) -> Tensor");
    m.def("csr_sum_out(Tensor x, Tensor ptr, Tensor? col, Tensor? values, Tensor? divide, Tensor? bias, "
          "Tensor(a!) out, bool add=False) -> ()");
    m.def("broadcast(Tensor g, Tensor ptr, Tensor? values, Tensor? divide, SymInt n_entries) -> Tensor");
    m.def("extremum(Tensor x, Tensor ptr, bool max) -> Tensor");
    m.def("extremum_backward(Tensor grad, Tensor x, Tensor y, Tensor ptr) -> Tensor");
    m.def("prod(Tensor x, Tensor ptr) -> Tensor");
    m.def("prod_backward(Tensor grad, Tensor x, Tensor ptr) -> Tensor");
    m.def("pair_prod(Tensor x, bool strided) -> Tensor");
    m.def("pair_prod_backward(Tensor grad, Tensor x, bool strided) -> Tensor");
    m.def("rows(Tensor x, Tensor index) -> Tensor");
    m.def("chunk_weight_grad(Tensor grad, Tensor t_ptr, Tensor t_col, Tensor? t_values, Tensor x, int chunks) -> Tensor");
    m.def("chunk_product(Tensor x, Tensor w, int chunks) -> Tensor");
    m.def("gathered_chunk_product(Tensor x, Tensor ptr, Tensor col, Tensor? values, Tensor w, int chunks) -> Tensor");
    m.def("gathered_chunk_backward(Tensor grad, Tensor x, Tensor w, Tensor t_ptr, Tensor t_col, Tensor? t_values, "
          "bool source_grad, bool weight_grad) -> (Tensor, Tensor)");
    // With their autograd in C++ (eager only).
    m.def("gather_sum(Tensor x, Tensor ptr, Tensor col, Tensor? values, Tensor t_ptr, Tensor t_col, "
          "Tensor? t_values, Tensor? bias=None) -> Tensor");
    m.def("segment_sum(Tensor x, Tensor ptr, Tensor? values, Tensor? divide) -> Tensor");
    m.def("segment_extremum(Tensor x, Tensor ptr, bool max) -> Tensor");
}

TORCH_LIBRARY_IMPL(neurovec_cpu, CPU, m) {
    m.impl("csr_sum", csr_sum_op);
    m.impl("csr_sum_out", csr_sum_out_op);
    m.impl("broadcast", broadcast);
    m.impl("extremum", extremum);
    m.impl("extremum_backward", extremum_backward);
    m.impl("prod", prod);
    m.impl("prod_backward", prod_backward);
    m.impl("pair_prod", pair_prod);
    m.impl("pair_prod_backward", pair_prod_backward);
    m.impl("rows", rows);
    m.impl("chunk_weight_grad", chunk_weight_grad);
    m.impl("chunk_product", chunk_product);
    m.impl("gathered_chunk_product", gathered_chunk_product);
    m.impl("gathered_chunk_backward", gathered_chunk_backward);
    m.impl("gather_sum", gather_sum_cpu);
    m.impl("segment_sum", segment_sum_cpu);
    m.impl("segment_extremum", extremum);
}

TORCH_LIBRARY_IMPL(neurovec_cpu, Autograd, m) {
    m.impl("gather_sum", gather_sum_autograd);
    m.impl("segment_sum", segment_sum_autograd);
    m.impl("segment_extremum", segment_extremum_autograd);
}
