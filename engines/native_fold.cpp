// neurovec's compile-time fold kernel: the sequential sum of gathered, weighted fact rows.
//
// fold_constants (compiler/passes/fold_constants.py) folds GCN's, SAGE's and GIN's first
// aggregation over the node features into a constant: value[j] = sum over the entries e of
// segment j of coef[e] * facts[index[e]], in float64. Its values must be bit for bit what
// `sequential_sums` there computes (NOTE: [sequential sums]), on every machine:
//
//   * every product coef[e] * x rounded on its own, never fused with the addition that follows
//     (no contracted multiply-add: this file is compiled with floating-point contraction off, by
//     the pragmas below, whatever the build's flags);
//   * per segment and feature, added in entry order, starting from 0.0: ((0.0 + p0) + p1) + ...
//     (vectorised across the features only, never across the entries of a sum).
//
// It reads each gathered row once, straight into the segment's running sums (the numpy path
// copies it into a buffer, multiplies the buffer and adds it up: three passes), asks for the row
// kPrefetchAhead entries ahead while it adds the current one (the rows come at random from a table
// far larger than the caches: the loop is bound by memory latency), and splits the segments over
// torch's intra-op threads (at::parallel_for: torch.get_num_threads() of them), each segment
// computed by one thread, so the order of its sum does not depend on the number of threads.
// Two more kernels of the compile live here: csr_transpose (the module's A^T) and
// gathered_wrapping_sums (dedup's multiset hashes).
// engines/native.py builds this file with native_ops.cpp into one library, torch.ops.neurovec_cpu.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cstdint>
#include <algorithm>
#include <atomic>
#include <memory>
#include <tuple>
#include <vector>
#include <type_traits>

// Floating-point contraction off from here on (a*b+c stays two roundings). GCC's default in its
// GNU dialects is -ffp-contract=fast, which with -march=native on a CPU with FMA may fuse
// `acc + c * x` into one rounding; tests/test_native_fold.py checks the values against the numpy
// path on data where a fused multiply-add would differ.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace {

constexpr int64_t kFoldPrefetchAhead = 8;
// Below this many gathered values the kernel runs on the calling thread.
constexpr int64_t kFoldParallelValues = 1 << 16;

// Into every cache level (hint 3, as native_ops.cpp's prefetch_row): with the non-temporal hint 0 the
// fold at products-like x 1/8 (8M rows of 100 floats) took 1.2-1.3 s, with hint 3 0.55-0.8 s.
inline void prefetch_bytes(const void* row, int64_t bytes) {
    const char* p = static_cast<const char*>(row);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
}

// Segments [r0, r1): y[j, k] = ((0.0 + c[s] * x[i[s], k]) + c[s + 1] * x[i[s + 1], k]) + ...
// X is the fact table's type: double, or float when every fact is a float (engines/native.py checks):
// a float widens to double exactly, so the products and sums are the same bit for bit, and the rows
// read at random are half as long.
template <typename X, typename I, bool WEIGHTED>
void fold_rows(const X* __restrict__ x, const I* __restrict__ index, const double* __restrict__ coef,
               const int64_t* __restrict__ ptr, int64_t w, double* __restrict__ y, int64_t r0, int64_t r1) {
    const int64_t row_bytes = w * (int64_t)sizeof(X);
    const int64_t e_end = ptr[r1];
    for (int64_t j = r0; j < r1; ++j) {
        double* __restrict__ yr = y + j * w;
        for (int64_t k = 0; k < w; ++k) yr[k] = 0.0;  // the sums start from 0.0 (here: the row is in cache)
        const int64_t e1 = ptr[j + 1];
        for (int64_t e = ptr[j]; e < e1; ++e) {
            if (e + kFoldPrefetchAhead < e_end) prefetch_bytes(x + (int64_t)index[e + kFoldPrefetchAhead] * w, row_bytes);
            const X* __restrict__ xr = x + (int64_t)index[e] * w;
            if constexpr (WEIGHTED) {
                const double c = coef[e];
#pragma omp simd
                for (int64_t k = 0; k < w; ++k) {
                    const double p = c * (double)xr[k];
                    yr[k] = yr[k] + p;
                }
            } else {
#pragma omp simd
                for (int64_t k = 0; k < w; ++k) yr[k] = yr[k] + (double)xr[k];
            }
        }
    }
}

// The first segment of thread t's share: about total * t / n entries before it.
int64_t fold_split(const int64_t* ptr, int64_t n_rows, int64_t t, int64_t n) {
    if (t <= 0) return 0;
    if (t >= n) return n_rows;
    const int64_t target = ptr[n_rows] / n * t + (ptr[n_rows] % n) * t / n;
    int64_t lo = 0, hi = n_rows;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (ptr[mid] < target) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// fold_sums(x (rows, w) float64 or float32, index (E,) int32/int64, coef (E,) float64 or None, ptr (n + 1,) int64)
// -> (n, w) float64: the segment sums described at the top of this file, computed in float64 whatever x's
// type. The caller (engines/native.py) checks the index range and that ptr runs from 0 to E, sorted.
at::Tensor fold_sums(const at::Tensor& x, const at::Tensor& index, const c10::optional<at::Tensor>& coef,
                     const at::Tensor& ptr) {
    TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kDouble || x.scalar_type() == at::kFloat) && x.is_contiguous(),
                "fold_sums: x must be a contiguous 2-d float64 or float32 tensor");
    TORCH_CHECK(ptr.dim() == 1 && ptr.scalar_type() == at::kLong && ptr.is_contiguous() && ptr.numel() >= 1, "fold_sums: ptr must be a contiguous 1-d int64 tensor");
    TORCH_CHECK(index.dim() == 1 && index.is_contiguous(), "fold_sums: index must be a contiguous 1-d tensor");
    const bool weighted = coef.has_value() && coef->defined();
    if (weighted)
        TORCH_CHECK(coef->dim() == 1 && coef->scalar_type() == at::kDouble && coef->is_contiguous() && coef->numel() == index.numel(),
                    "fold_sums: coef must be a contiguous float64 tensor as long as index");
    const int64_t n = ptr.numel() - 1, w = x.size(1);
    const int64_t* p = ptr.data_ptr<int64_t>();
    TORCH_CHECK(p[0] == 0 && p[n] == index.numel(), "fold_sums: ptr must run from 0 to the number of entries");
    if (n == 0 || w == 0 || index.numel() == 0) return at::zeros({n, w}, x.options().dtype(at::kDouble));
    at::Tensor y = at::empty({n, w}, x.options().dtype(at::kDouble));  // fold_rows zeroes each row
    const double* cd = weighted ? coef->data_ptr<double>() : nullptr;
    double* yd = y.data_ptr<double>();
    const int64_t threads = (index.numel() * w < kFoldParallelValues || n < 2) ? 1 : at::get_num_threads();
    AT_DISPATCH_INDEX_TYPES(index.scalar_type(), "fold_sums", [&] {
        const index_t* id = index.data_ptr<index_t>();
        auto run = [&](int64_t r0, int64_t r1) {
            if (x.scalar_type() == at::kFloat) {
                const float* xf = x.data_ptr<float>();
                if (weighted) fold_rows<float, index_t, true>(xf, id, cd, p, w, yd, r0, r1);
                else fold_rows<float, index_t, false>(xf, id, cd, p, w, yd, r0, r1);
            } else {
                const double* xd = x.data_ptr<double>();
                if (weighted) fold_rows<double, index_t, true>(xd, id, cd, p, w, yd, r0, r1);
                else fold_rows<double, index_t, false>(xd, id, cd, p, w, yd, r0, r1);
            }
        };
        if (threads <= 1) {
            run(0, n);
            return;
        }
        at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) run(fold_split(p, n, t, threads), fold_split(p, n, t + 1, threads));
        });
    });
    return y;
}


// csr_transpose(index (E,) int32/int64, ptr (S + 1,) int64, n_sources, values (E,) or None, index_dtype,
// with_perm) -> (t_ptr (N + 1,), t_col (E,), t_perm (E,) int64 or empty, t_values (E,) or empty): the transpose of the CSR
// matrix whose segment j owns the entries ptr[j]:ptr[j + 1] and whose entry e is in column index[e],
// by a counting sort: the entries grouped by column (t_ptr: each column's bounds), each column's
// entries in their order in the CSR (a stable sort by column: t_perm[k] is the entry at place k),
// t_col[k] the segment of entry t_perm[k] and t_values[k] = values[t_perm[k]] (copied bit for bit,
// any dtype). t_ptr and t_col are index_dtype (int32 or int64). Without with_perm, t_perm is not made:
// the modules keep t_values, not t_perm (at products-like, 500 MB less written twice: the module took
// 3.7-4.1 s instead of 5.3-6.2). One pass to count, one to place:
// GatherSum.from_index's A^T (engines/kernels.py), without a sort and the gathers after it. It
// refuses an index outside [0, n_sources) and a ptr that does not run from 0 to E, sorted.
// Columns per bucket of the first pass: about kTransposeBuckets buckets, so that the first pass writes as
// many streams at a time (each a cache line per array: they stay in cache) and the second pass places
// one bucket's entries, on average E / kTransposeBuckets of them, within a region that stays in cache.
constexpr int64_t kTransposeBuckets = 1024;

// Two passes (a most-significant-digit radix sort by column, both passes stable): the first moves the
// entries, in order, to their bucket's region of the outputs -- a bucket's entries end up in the same
// places as its columns' entries, [t_ptr[first column], t_ptr[last column + 1]) --, with each entry's
// column within its bucket in `local`; the second sorts each bucket's region in place by column, through a
// copy of it. Writing every entry straight to its column's place instead is one write at random per
// entry and array: 3x slower at products-like x 1/8 (8M entries, 306k columns).
// On several threads (torch's intra-op threads), the first pass splits the segments into one contiguous
// share per thread (about as many entries each): a count of each share's entries per bucket gives every
// share its own cursor in each bucket, after the shares before it, so the entries land where the one-thread
// pass puts them. The second pass splits the buckets (disjoint regions). The result is the same on any
// number of threads, bit for bit.
template <typename I, typename O, typename V, bool kPerm>
void transpose_entries(const I* __restrict__ index, const int64_t* __restrict__ ptr, int64_t n_seg,
                       const int64_t* __restrict__ t_ptr, int64_t n_cols, O* __restrict__ t_col,
                       int64_t* __restrict__ t_perm, const V* __restrict__ values, V* __restrict__ t_values,
                       int64_t threads) {
    constexpr bool kValues = !std::is_same<V, void*>::value;
    int shift = 0;
    while ((n_cols >> shift) > kTransposeBuckets) ++shift;
    const int64_t n_buckets = ((n_cols - 1) >> shift) + 1;
    std::unique_ptr<int32_t[]> local(new int32_t[t_ptr[n_cols]]);  // every entry written before it is read
    const int32_t mask = (int32_t)((int64_t(1) << shift) - 1);
    std::vector<int64_t> share(threads + 1);
    for (int64_t t = 0; t <= threads; ++t) share[t] = fold_split(ptr, n_seg, t, threads);
    std::vector<int64_t> cursor(threads * n_buckets, 0);  // share t's next place in bucket b: [t * n_buckets + b]
    auto count = [&](int64_t t) {
        int64_t* c = cursor.data() + t * n_buckets;
        for (int64_t e = ptr[share[t]]; e < ptr[share[t + 1]]; ++e) ++c[(int64_t)index[e] >> shift];
    };
    if (threads > 1) at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) { for (int64_t t = t0; t < t1; ++t) count(t); });
    for (int64_t b = 0; b < n_buckets; ++b) {
        int64_t next = t_ptr[b << shift];
        for (int64_t t = 0; t < threads; ++t) {
            const int64_t here = cursor[t * n_buckets + b];
            cursor[t * n_buckets + b] = next;
            next += here;
        }
    }
    auto move = [&](int64_t t) {
        int64_t* c = cursor.data() + t * n_buckets;
        for (int64_t j = share[t]; j < share[t + 1]; ++j) {
            const int64_t e1 = ptr[j + 1];
            for (int64_t e = ptr[j]; e < e1; ++e) {
                const int64_t i = (int64_t)index[e];
                const int64_t k = c[i >> shift]++;
                t_col[k] = (O)j;
                if constexpr (kPerm) t_perm[k] = e;
                local[k] = (int32_t)i & mask;
                if constexpr (kValues) t_values[k] = values[e];
            }
        }
    };
    if (threads > 1) at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) { for (int64_t t = t0; t < t1; ++t) move(t); });
    else move(0);
    auto sort_buckets = [&](int64_t b0, int64_t b1) {
        std::vector<int64_t> place(int64_t(1) << shift);
        std::vector<O> col_copy;
        std::vector<int64_t> perm_copy;
        std::vector<typename std::conditional<kValues, V, char>::type> values_copy;
        for (int64_t b = b0; b < b1; ++b) {
            const int64_t c0 = b << shift, c1 = std::min(n_cols, (b + 1) << shift);
            const int64_t k0 = t_ptr[c0], k1 = t_ptr[c1], n = k1 - k0;
            if (c1 - c0 <= 1 || n <= 1) continue;  // one column: already in order
            for (int64_t c = c0; c < c1; ++c) place[c - c0] = t_ptr[c];
            col_copy.assign(t_col + k0, t_col + k1);
            if constexpr (kPerm) perm_copy.assign(t_perm + k0, t_perm + k1);
            if constexpr (kValues) values_copy.assign(t_values + k0, t_values + k1);
            for (int64_t q = 0; q < n; ++q) {
                const int64_t k = place[local[k0 + q]]++;
                t_col[k] = col_copy[q];
                if constexpr (kPerm) t_perm[k] = perm_copy[q];
                if constexpr (kValues) t_values[k] = values_copy[q];
            }
        }
    };
    if (threads > 1) at::parallel_for(0, n_buckets, 1, sort_buckets);
    else sort_buckets(0, n_buckets);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> csr_transpose(
        const at::Tensor& index, const at::Tensor& ptr, int64_t n_sources, const c10::optional<at::Tensor>& values,
        at::ScalarType index_dtype, bool with_perm) {
    TORCH_CHECK(ptr.dim() == 1 && ptr.scalar_type() == at::kLong && ptr.is_contiguous() && ptr.numel() >= 1, "csr_transpose: ptr must be a contiguous 1-d int64 tensor");
    TORCH_CHECK(index.dim() == 1 && index.is_contiguous(), "csr_transpose: index must be a contiguous 1-d tensor");
    TORCH_CHECK(index_dtype == at::kInt || index_dtype == at::kLong, "csr_transpose: index_dtype must be int32 or int64");
    TORCH_CHECK(n_sources >= 0, "csr_transpose: n_sources must be >= 0");
    const bool weighted = values.has_value() && values->defined();
    const int64_t e_count = index.numel(), n_seg = ptr.numel() - 1;
    if (weighted)
        TORCH_CHECK(values->dim() == 1 && values->is_contiguous() && values->numel() == e_count,
                    "csr_transpose: values must be a contiguous 1-d tensor as long as index");
    const int64_t* p = ptr.data_ptr<int64_t>();
    TORCH_CHECK(p[0] == 0 && p[n_seg] == e_count, "csr_transpose: ptr must run from 0 to the number of entries");
    for (int64_t j = 0; j < n_seg; ++j) TORCH_CHECK(p[j] <= p[j + 1], "csr_transpose: ptr must be sorted");
    at::Tensor t_ptr = at::zeros({n_sources + 1}, ptr.options());
    int64_t* tp = t_ptr.data_ptr<int64_t>();
    at::Tensor t_perm = at::empty({with_perm ? e_count : 0}, ptr.options());
    at::Tensor t_col = at::empty({e_count}, ptr.options().dtype(index_dtype));
    at::Tensor t_values = weighted ? at::empty({e_count}, values->options()) : at::empty({0}, ptr.options());
    const int64_t threads = (e_count < kFoldParallelValues || n_seg < 2) ? 1 : std::max<int64_t>(1, at::get_num_threads());
    AT_DISPATCH_INDEX_TYPES(index.scalar_type(), "csr_transpose", [&] {
        const index_t* id = index.data_ptr<index_t>();
        for (int64_t e = 0; e < e_count; ++e) {
            const int64_t i = (int64_t)id[e];
            TORCH_CHECK(i >= 0 && i < n_sources, "csr_transpose: index ", i, " is outside the ", n_sources, " columns");
            ++tp[i + 1];
        }
        for (int64_t i = 0; i < n_sources; ++i) tp[i + 1] += tp[i];
        auto place = [&](auto* col, auto perm_flag) {
            using O = std::remove_pointer_t<decltype(col)>;
            constexpr bool kPerm = decltype(perm_flag)::value;
            int64_t* perm = kPerm ? t_perm.data_ptr<int64_t>() : nullptr;
            if (!weighted) {
                transpose_entries<index_t, O, void*, kPerm>(id, p, n_seg, tp, n_sources, col, perm, nullptr, nullptr, threads);
                return;
            }
            const int64_t bytes = values->element_size();
            const void* v = values->data_ptr();
            void* tv = t_values.data_ptr();
            if (bytes == 8) transpose_entries<index_t, O, uint64_t, kPerm>(id, p, n_seg, tp, n_sources, col, perm, (const uint64_t*)v, (uint64_t*)tv, threads);
            else if (bytes == 4) transpose_entries<index_t, O, uint32_t, kPerm>(id, p, n_seg, tp, n_sources, col, perm, (const uint32_t*)v, (uint32_t*)tv, threads);
            else if (bytes == 2) transpose_entries<index_t, O, uint16_t, kPerm>(id, p, n_seg, tp, n_sources, col, perm, (const uint16_t*)v, (uint16_t*)tv, threads);
            else if (bytes == 1) transpose_entries<index_t, O, uint8_t, kPerm>(id, p, n_seg, tp, n_sources, col, perm, (const uint8_t*)v, (uint8_t*)tv, threads);
            else TORCH_CHECK(false, "csr_transpose: values of ", bytes, " bytes per entry");
        };
        auto place_perm = [&](auto* col) {
            if (with_perm) place(col, std::true_type{});
            else place(col, std::false_type{});
        };
        if (index_dtype == at::kInt) place_perm(t_col.data_ptr<int32_t>());
        else place_perm(t_col.data_ptr<int64_t>());
    });
    return {index_dtype == at::kLong ? t_ptr : t_ptr.to(index_dtype), t_col, t_perm, t_values};
}

// dedup's multiset hashes (compiler/grouping.py, `_multiset_hashes`): per segment j, the sum modulo
// 2^64 of mixed[index[e]] over its entries, mixed holding uint64 bits in an int64 tensor. Integer
// sums wrap exactly in any order, so the segments split over torch's threads as in fold_sums. One
// pass over the index, reading a table of one word per label (at products-like 20 MB: in the
// caches); numpy gathers a chunk of the words, then adds them up (0.6 s against 1.7 s at 62M).
at::Tensor gathered_wrapping_sums(const at::Tensor& mixed, const at::Tensor& index, const at::Tensor& ptr) {
    TORCH_CHECK(mixed.dim() == 1 && mixed.scalar_type() == at::kLong && mixed.is_contiguous(),
                "gathered_wrapping_sums: mixed must be a contiguous 1-d int64 tensor");
    TORCH_CHECK(ptr.dim() == 1 && ptr.scalar_type() == at::kLong && ptr.is_contiguous() && ptr.numel() >= 1,
                "gathered_wrapping_sums: ptr must be a contiguous 1-d int64 tensor");
    TORCH_CHECK(index.dim() == 1 && index.is_contiguous(), "gathered_wrapping_sums: index must be a contiguous 1-d tensor");
    const int64_t n = ptr.numel() - 1;
    const int64_t* p = ptr.data_ptr<int64_t>();
    TORCH_CHECK(p[0] == 0 && p[n] == index.numel(), "gathered_wrapping_sums: ptr must run from 0 to the number of entries");
    for (int64_t j = 0; j < n; ++j) TORCH_CHECK(p[j] <= p[j + 1], "gathered_wrapping_sums: ptr must be sorted");
    at::Tensor sums = at::empty({n}, mixed.options());
    const uint64_t* m = reinterpret_cast<const uint64_t*>(mixed.data_ptr<int64_t>());
    uint64_t* out = reinterpret_cast<uint64_t*>(sums.data_ptr<int64_t>());
    const uint64_t labels = (uint64_t)mixed.numel();
    const int64_t threads = (index.numel() < kFoldParallelValues || n < 2) ? 1 : at::get_num_threads();
    std::atomic<bool> outside{false};
    AT_DISPATCH_INDEX_TYPES(index.scalar_type(), "gathered_wrapping_sums", [&] {
        const index_t* id = index.data_ptr<index_t>();
        auto run = [&](int64_t r0, int64_t r1) {
            for (int64_t j = r0; j < r1; ++j) {
                uint64_t sum = 0;
                for (int64_t e = p[j]; e < p[j + 1]; ++e) {
                    const uint64_t i = (uint64_t)(int64_t)id[e];  // a negative index wraps to a huge one
                    if (i >= labels) {
                        outside = true;
                        return;
                    }
                    sum += m[i];
                }
                out[j] = sum;
            }
        };
        if (threads <= 1) {
            run(0, n);
            return;
        }
        at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) run(fold_split(p, n, t, threads), fold_split(p, n, t + 1, threads));
        });
    });
    TORCH_CHECK(!outside, "gathered_wrapping_sums: an index is outside the ", labels, " labels");
    return sums;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(neurovec_cpu, m) {
    m.def("fold_sums(Tensor x, Tensor index, Tensor? coef, Tensor ptr) -> Tensor");
    m.def("csr_transpose(Tensor index, Tensor ptr, int n_sources, Tensor? values, ScalarType index_dtype, bool with_perm) -> (Tensor, Tensor, Tensor, Tensor)");
    m.def("gathered_wrapping_sums(Tensor mixed, Tensor index, Tensor ptr) -> Tensor");
}

TORCH_LIBRARY_IMPL(neurovec_cpu, CPU, m) {
    m.impl("fold_sums", fold_sums);
    m.impl("csr_transpose", csr_transpose);
    m.impl("gathered_wrapping_sums", gathered_wrapping_sums);
}
