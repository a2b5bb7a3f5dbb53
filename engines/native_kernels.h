// neurovec's native CPU kernels: segment reductions over sorted, static CSR segments.
//
// Templates shared by the two libraries engines/native.py builds on first use:
// native_kernels.cpp (plain C functions, no torch headers, called through ctypes) and
// native_ops.cpp (the same kernels as torch operators, their autograd in C++). Every
// kernel has a pure-torch equivalent in engines/ops.py, used when neither can be built;
// tests compare them.
//
// Layout: values are row-major (rows, width) arrays; segment j owns the CSR range
// ptr[j] .. ptr[j+1]-1 of "entries" e. An entry reads source row col[e] (or row e
// when col is null: a plain segment reduction) times val[e] (1 when val is null).
// Nothing ever writes to the same output row from two threads: threads own
// disjoint ranges of segments, balanced by their number of entries.
#pragma once

#include <cmath>
#include <cstdint>
#include <omp.h>

namespace {

// Below this many multiply-adds a kernel runs on the calling thread: waking the
// OpenMP team costs a few microseconds, more than the work itself.
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

// Run body(row_begin, row_end) over all segments, split among the threads.
template <typename I, typename Body>
void for_segments(const I* ptr, int64_t n_rows, int64_t width, int n_threads, Body body) {
    const int64_t work = (int64_t)ptr[n_rows] * (width > 0 ? width : 1);
    if (n_threads <= 1 || work < kParallelWork || n_rows < 2) {
        body((int64_t)0, n_rows);
        return;
    }
#pragma omp parallel num_threads(n_threads)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        body(split_point(ptr, n_rows, t, n), split_point(ptr, n_rows, t + 1, n));
    }
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

// ---------------------------------------------------------------- weighted sums
//
// y[j] = sum_e c[e] * x[src(e)]  (src(e) = col[e], or e when col is null),
// then y[j] /= divide[j] if divide is given (a mean). Accumulates in registers
// (fixed widths) or in the output row.

template <typename T, typename I, typename WT, bool GATHER, bool WEIGHTED>
void sum_rows(int64_t r0, int64_t r1, const I* __restrict__ ptr, const I* __restrict__ col,
              const T* __restrict__ val, const T* __restrict__ x, int64_t w_any, T* __restrict__ y,
              const T* __restrict__ divide) {
    constexpr int kW = WT::value;
    const int64_t w = kW ? kW : w_any;
    constexpr int kAcc = kW ? kW : 1;
    for (int64_t r = r0; r < r1; ++r) {
        T acc_fixed[kAcc];
        T* __restrict__ acc = kW ? acc_fixed : y + r * w;
        for (int64_t k = 0; k < w; ++k) acc[k] = T(0);
        const int64_t e1 = ptr[r + 1];
        for (int64_t e = ptr[r]; e < e1; ++e) {
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
        T* __restrict__ yr = y + r * w;
        if (divide) {
            const T d = divide[r];
            for (int64_t k = 0; k < w; ++k) yr[k] = acc[k] / d;
        } else if (kW) {
            for (int64_t k = 0; k < w; ++k) yr[k] = acc[k];
        }
    }
}

// The loop-invariant choices (gather or contiguous rows, weighted or not) are
// template arguments: as run-time branches they cost 2-4x on short segments.
template <typename T, typename I>
void segment_sum(int64_t n_rows, const I* ptr, const I* col, const T* val, const T* x, int64_t w, T* y,
                 const T* divide, int n_threads) {
    for_segments(ptr, n_rows, w, n_threads, [&](int64_t r0, int64_t r1) {
        with_width(w, [&](auto width) {
            using WT = decltype(width);
            if (col) {
                if (val) sum_rows<T, I, WT, true, true>(r0, r1, ptr, col, val, x, w, y, divide);
                else sum_rows<T, I, WT, true, false>(r0, r1, ptr, col, val, x, w, y, divide);
            } else {
                if (val) sum_rows<T, I, WT, false, true>(r0, r1, ptr, col, val, x, w, y, divide);
                else sum_rows<T, I, WT, false, false>(r0, r1, ptr, col, val, x, w, y, divide);
            }
        });
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
                       const T* divide, int n_threads) {
    for_segments(ptr, n_rows, w, n_threads, [&](int64_t r0, int64_t r1) {
        with_width(w, [&](auto width) {
            using WT = decltype(width);
            if (val) broadcast_rows<T, I, WT, true>(r0, r1, ptr, val, g, w, out, divide);
            else broadcast_rows<T, I, WT, false>(r0, r1, ptr, val, g, w, out, divide);
        });
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
void segment_extremum(int64_t n_rows, const I* ptr, const I* col, const T* x, int64_t w, T* y, int n_threads) {
    for_segments(ptr, n_rows, w, n_threads, [&](int64_t r0, int64_t r1) {
        with_width(w, [&](auto width) {
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
    });
}

template <typename T, typename I>
void segment_extremum_backward(int64_t n_rows, const I* ptr, const T* x, const T* y, const T* g, int64_t w,
                               T* out, T* ties, int n_threads) {
    // ties: (n_rows, w) scratch.
    for_segments(ptr, n_rows, w, n_threads, [&](int64_t r0, int64_t r1) {
        with_width(w, [&](auto width) {
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
    });
}

}  // namespace
