// neurovec's native CPU kernels as plain C functions (no torch headers), loaded with ctypes.
//
// Built on first use by engines/native.py (g++ -O3 -march=native -fopenmp) and cached
// per source hash; the kernels themselves are in native_kernels.h.
//
// Exported symbols are extern "C" and named nv_<kernel>_<f32|f64>.
#include <omp.h>

#include <cstdint>

namespace {

// The tasks of native_kernels.h's for_segments, one per thread of an OpenMP team.
template <typename Task>
void run_tasks(int64_t n_tasks, const Task& task) {
#pragma omp parallel for num_threads(n_tasks)
    for (int64_t i = 0; i < n_tasks; ++i) task(i);
}

}  // namespace

#include "native_kernels.h"
// ---------------------------------------------------------------- C interface
//
// Gathers index with int32 (ptr and col of a GatherSum: 4 bytes per entry to read),
// plain segment reductions with int64 ptr (the module's segment buffers).

#define NV_EXPORT_ALL(T, TN)                                                                                \
    extern "C" void nv_gather_sum_##TN(int64_t n_rows, const int32_t* ptr, const int32_t* col, const T* val, \
                                       const T* x, int64_t w, T* y, int nt) {                               \
        segment_sum<T, int32_t>(n_rows, ptr, col, val, x, w, y, nullptr, nt);                               \
    }                                                                                                       \
    extern "C" void nv_segment_sum_##TN(int64_t n_rows, const int64_t* ptr, const T* val, const T* x,       \
                                        int64_t w, T* y, const T* divide, int nt) {                         \
        segment_sum<T, int64_t>(n_rows, ptr, nullptr, val, x, w, y, divide, nt);                             \
    }                                                                                                       \
    extern "C" void nv_segment_broadcast_##TN(int64_t n_rows, const int64_t* ptr, const T* val, const T* g,  \
                                              int64_t w, T* out, const T* divide, int nt) {                 \
        segment_broadcast<T, int64_t>(n_rows, ptr, val, g, w, out, divide, nt);                             \
    }                                                                                                       \
    extern "C" void nv_segment_max_##TN(int64_t n_rows, const int64_t* ptr, const T* x, int64_t w, T* y,     \
                                        int nt) {                                                           \
        segment_extremum<true, T, int64_t>(n_rows, ptr, nullptr, x, w, y, nt);                              \
    }                                                                                                       \
    extern "C" void nv_segment_min_##TN(int64_t n_rows, const int64_t* ptr, const T* x, int64_t w, T* y,     \
                                        int nt) {                                                           \
        segment_extremum<false, T, int64_t>(n_rows, ptr, nullptr, x, w, y, nt);                             \
    }                                                                                                       \
    extern "C" void nv_segment_extremum_backward_##TN(int64_t n_rows, const int64_t* ptr, const T* x,       \
                                                      const T* y, const T* g, int64_t w, T* out, T* ties,   \
                                                      int nt) {                                             \
        segment_extremum_backward<T, int64_t>(n_rows, ptr, x, y, g, w, out, ties, nt);                      \
    }

NV_EXPORT_ALL(float, f32)
NV_EXPORT_ALL(double, f64)
