// neurovec's native CPU kernels: segment reductions over sorted, static CSR segments.
//
// Built on first use by engines/native.py (g++ -O3 -march=native -fopenmp, no torch
// headers: plain pointers in, loaded with ctypes) and cached per source hash. Every
// function has a pure-torch equivalent in engines/kernels.py, which is used when
// this library cannot be built; tests compare the two.
//
// Layout: values are row-major (rows, width) arrays; segment j owns the CSR range
// ptr[j] .. ptr[j+1]-1 of "entries" e. An entry reads source row col[e] (or row e
// when col is null: a plain segment reduction) times val[e] (1 when val is null).
// Nothing ever writes to the same output row from two threads: threads own
// disjoint ranges of segments, balanced by their number of entries.
//
// Exported symbols are extern "C" and named nv_<kernel>_<f32|f64>_<i32|i64>.
#include <cmath>
#include <cstdint>
#include <omp.h>

namespace {

// Below this many multiply-adds a kernel runs on the calling thread: waking the
// OpenMP team costs a few microseconds, more than the work itself.
constexpr int64_t kParallelWork = 32768;

// Segments [begin[t], begin[t+1]) go to thread t, with about the same number of
// entries each (a binary search of ptr for every split point).
template <typename I>
int64_t split_point(const I* ptr, int64_t n_rows, int t, int n_threads) {
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

// ---------------------------------------------------------------- weighted sums
//
// y[j] = sum_e c[e] * x[src(e)]  (src(e) = col[e], or e when col is null),
// then y[j] /= divide[j] if divide is given (a mean). The width is a template
// argument for the common narrow widths, so the inner loop is fully unrolled
// into registers; other widths accumulate in the output row.

template <typename T, typename I, int W>
void sum_rows_fixed(int64_t r0, int64_t r1, const I* ptr, const I* col, const T* val, const T* x,
                    T* y, const T* divide) {
    for (int64_t r = r0; r < r1; ++r) {
        T acc[W];
        for (int k = 0; k < W; ++k) acc[k] = T(0);
        const int64_t e1 = ptr[r + 1];
        for (int64_t e = ptr[r]; e < e1; ++e) {
            const T* xr = x + (col ? (int64_t)col[e] : e) * W;
            if (val) {
                const T v = val[e];
                for (int k = 0; k < W; ++k) acc[k] += v * xr[k];
            } else {
                for (int k = 0; k < W; ++k) acc[k] += xr[k];
            }
        }
        T* yr = y + r * W;
        if (divide) {
            const T d = divide[r];
            for (int k = 0; k < W; ++k) yr[k] = acc[k] / d;
        } else {
            for (int k = 0; k < W; ++k) yr[k] = acc[k];
        }
    }
}

template <typename T, typename I>
void sum_rows_any(int64_t r0, int64_t r1, const I* ptr, const I* col, const T* val, const T* x,
                  int64_t w, T* y, const T* divide) {
    for (int64_t r = r0; r < r1; ++r) {
        T* yr = y + r * w;
        for (int64_t k = 0; k < w; ++k) yr[k] = T(0);
        const int64_t e1 = ptr[r + 1];
        for (int64_t e = ptr[r]; e < e1; ++e) {
            const T* xr = x + (col ? (int64_t)col[e] : e) * w;
            const T v = val ? val[e] : T(1);
            for (int64_t k = 0; k < w; ++k) yr[k] += v * xr[k];
        }
        if (divide) {
            const T d = divide[r];
            for (int64_t k = 0; k < w; ++k) yr[k] /= d;
        }
    }
}

template <typename T, typename I>
void segment_sum(int64_t n_rows, const I* ptr, const I* col, const T* val, const T* x, int64_t w, T* y,
                 const T* divide, int n_threads) {
    for_segments(ptr, n_rows, w, n_threads, [&](int64_t r0, int64_t r1) {
        switch (w) {
            case 1: sum_rows_fixed<T, I, 1>(r0, r1, ptr, col, val, x, y, divide); break;
            case 2: sum_rows_fixed<T, I, 2>(r0, r1, ptr, col, val, x, y, divide); break;
            case 3: sum_rows_fixed<T, I, 3>(r0, r1, ptr, col, val, x, y, divide); break;
            case 4: sum_rows_fixed<T, I, 4>(r0, r1, ptr, col, val, x, y, divide); break;
            case 8: sum_rows_fixed<T, I, 8>(r0, r1, ptr, col, val, x, y, divide); break;
            case 16: sum_rows_fixed<T, I, 16>(r0, r1, ptr, col, val, x, y, divide); break;
            case 32: sum_rows_fixed<T, I, 32>(r0, r1, ptr, col, val, x, y, divide); break;
            case 64: sum_rows_fixed<T, I, 64>(r0, r1, ptr, col, val, x, y, divide); break;
            default: sum_rows_any<T, I>(r0, r1, ptr, col, val, x, w, y, divide);
        }
    });
}

// ---------------------------------------------------------------- broadcast
//
// The backward of a plain segment sum / mean: every entry of segment j gets
// g[j] (times val[e], divided by divide[j]): out[e] = c[e] * g[j] / d[j].
template <typename T, typename I>
void segment_broadcast(int64_t n_rows, const I* ptr, const T* val, const T* g, int64_t w, T* out,
                       const T* divide, int n_threads) {
    for_segments(ptr, n_rows, w, n_threads, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const T* gr = g + r * w;
            const int64_t e1 = ptr[r + 1];
            for (int64_t e = ptr[r]; e < e1; ++e) {
                T* o = out + e * w;
                if (divide) {
                    const T d = divide[r];
                    if (val) { const T v = val[e]; for (int64_t k = 0; k < w; ++k) o[k] = v * (gr[k] / d); }
                    else { for (int64_t k = 0; k < w; ++k) o[k] = gr[k] / d; }
                } else {
                    if (val) { const T v = val[e]; for (int64_t k = 0; k < w; ++k) o[k] = v * gr[k]; }
                    else { for (int64_t k = 0; k < w; ++k) o[k] = gr[k]; }
                }
            }
        }
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
inline bool better(T v, T m) { return MAX ? (v > m || std::isnan(v)) : (v < m || std::isnan(v)); }

template <bool MAX, typename T, typename I>
void segment_extremum(int64_t n_rows, const I* ptr, const I* col, const T* x, int64_t w, T* y, int n_threads) {
    for_segments(ptr, n_rows, w, n_threads, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            T* yr = y + r * w;
            const int64_t e0 = ptr[r], e1 = ptr[r + 1];
            if (e0 == e1) {  // an empty segment (never compiled): the identity, like torch.segment_reduce
                for (int64_t k = 0; k < w; ++k) yr[k] = MAX ? -INFINITY : INFINITY;
                continue;
            }
            const T* first = x + (col ? (int64_t)col[e0] : e0) * w;
            for (int64_t k = 0; k < w; ++k) yr[k] = first[k];
            for (int64_t e = e0 + 1; e < e1; ++e) {
                const T* xr = x + (col ? (int64_t)col[e] : e) * w;
                // A NaN stays once there ("v > NaN" is false) and replaces anything.
                for (int64_t k = 0; k < w; ++k) yr[k] = better<MAX>(xr[k], yr[k]) ? xr[k] : yr[k];
            }
        }
    });
}

template <typename T, typename I>
void segment_extremum_backward(int64_t n_rows, const I* ptr, const T* x, const T* y, const T* g, int64_t w,
                               T* out, T* ties, int n_threads) {
    // ties: (n_rows, w) scratch.
    for_segments(ptr, n_rows, w, n_threads, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const T* yr = y + r * w;
            const T* gr = g + r * w;
            T* tr = ties + r * w;
            const int64_t e0 = ptr[r], e1 = ptr[r + 1];
            for (int64_t k = 0; k < w; ++k) tr[k] = T(0);
            for (int64_t e = e0; e < e1; ++e) {
                const T* xr = x + e * w;
                for (int64_t k = 0; k < w; ++k) tr[k] += (xr[k] == yr[k]) ? T(1) : T(0);
            }
            for (int64_t k = 0; k < w; ++k) tr[k] = gr[k] / tr[k];  // now the share of each tie
            for (int64_t e = e0; e < e1; ++e) {
                const T* xr = x + e * w;
                T* o = out + e * w;
                for (int64_t k = 0; k < w; ++k) o[k] = (xr[k] == yr[k]) ? tr[k] : tr[k] * T(0);
            }
        }
    });
}

}  // namespace

// ---------------------------------------------------------------- C interface

#define NV_EXPORT_ALL(T, TN, I, IN)                                                                        \
    extern "C" void nv_segment_sum_##TN##_##IN(int64_t n_rows, const I* ptr, const I* col, const T* val,    \
                                               const T* x, int64_t w, T* y, const T* divide, int nt) {      \
        segment_sum<T, I>(n_rows, ptr, col, val, x, w, y, divide, nt);                                      \
    }                                                                                                       \
    extern "C" void nv_segment_broadcast_##TN##_##IN(int64_t n_rows, const I* ptr, const T* val, const T* g, \
                                                     int64_t w, T* out, const T* divide, int nt) {          \
        segment_broadcast<T, I>(n_rows, ptr, val, g, w, out, divide, nt);                                   \
    }                                                                                                       \
    extern "C" void nv_segment_max_##TN##_##IN(int64_t n_rows, const I* ptr, const I* col, const T* x,      \
                                               int64_t w, T* y, int nt) {                                   \
        segment_extremum<true, T, I>(n_rows, ptr, col, x, w, y, nt);                                        \
    }                                                                                                       \
    extern "C" void nv_segment_min_##TN##_##IN(int64_t n_rows, const I* ptr, const I* col, const T* x,      \
                                               int64_t w, T* y, int nt) {                                   \
        segment_extremum<false, T, I>(n_rows, ptr, col, x, w, y, nt);                                       \
    }                                                                                                       \
    extern "C" void nv_segment_extremum_backward_##TN##_##IN(int64_t n_rows, const I* ptr, const T* x,      \
                                                             const T* y, const T* g, int64_t w, T* out,     \
                                                             T* ties, int nt) {                             \
        segment_extremum_backward<T, I>(n_rows, ptr, x, y, g, w, out, ties, nt);                            \
    }

NV_EXPORT_ALL(float, f32, int32_t, i32)
NV_EXPORT_ALL(float, f32, int64_t, i64)
NV_EXPORT_ALL(double, f64, int32_t, i32)
NV_EXPORT_ALL(double, f64, int64_t, i64)

extern "C" int nv_version() { return 1; }
