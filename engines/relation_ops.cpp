// The segmented product of many relation types, fused with the gather before it and the sum after it
// (engines/relation_ops.py has the contract and the pure-torch equivalent).
//
//   out[t_col[e]] += t_values[e] * (w[p / C] . x[idx[p]])     for every product row p and edge e of p
//
// x (n_x, i), w (k, o, i), idx (k C), t_ptr (k C + 1) and t_col / t_values (edges): the transposed CSR of the
// sum (for each product row, the output rows that read it). One chunk of C rows at a time: its rows of x
// gathered into a small buffer, one GEMM with the chunk's weight, the products added into the outputs. The
// (k C, i) gathered rows and (k C, o) products are never materialised: the buffers stay in cache.
// Threads take whole chunks; each adds into an output of its own (summed at the end) where there are several.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <vector>

namespace {

// How many rows ahead the random reads and writes are prefetched: the rows are random (an edge's source, an
// output node), so the hardware cannot guess them, and one at a time each waits for the memory.
constexpr int64_t kAhead = 8;

template <typename scalar_t>
void gather_rows(const scalar_t* x, const int64_t* idx, int64_t rows, int64_t width, scalar_t* out) {
  for (int64_t p = 0; p < rows; ++p) {
    if (p + kAhead < rows) __builtin_prefetch(x + idx[p + kAhead] * width);
    const scalar_t* src = x + idx[p] * width;
    scalar_t* dst = out + p * width;
    for (int64_t j = 0; j < width; ++j) dst[j] = src[j];
  }
}

void check(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& idx, const torch::Tensor& t_ptr,
           const torch::Tensor& t_col, const c10::optional<torch::Tensor>& t_values) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(2), "relation_ops: x (n, i) and w (k, o, i)");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && x.scalar_type() == w.scalar_type(),
              "relation_ops: x and w contiguous, of one dtype");
  TORCH_CHECK(idx.scalar_type() == torch::kLong && t_ptr.scalar_type() == torch::kLong &&
                  t_col.scalar_type() == torch::kLong && idx.is_contiguous() && t_ptr.is_contiguous() &&
                  t_col.is_contiguous(),
              "relation_ops: idx, t_ptr and t_col contiguous int64");
  TORCH_CHECK(w.size(0) > 0 && idx.numel() % w.size(0) == 0 && t_ptr.numel() == idx.numel() + 1,
              "relation_ops: idx has C rows per weight, t_ptr one more entry than idx");
  if (t_values.has_value()) {
    TORCH_CHECK(t_values->scalar_type() == x.scalar_type() && t_values->is_contiguous() &&
                    t_values->numel() == t_col.numel(),
                "relation_ops: t_values contiguous, of x's dtype, one per edge");
  }
}

int threads_for(int64_t chunks) {
  return static_cast<int>(std::min<int64_t>(at::get_num_threads(), chunks));
}

}  // namespace

// The kernels work on detached tensors: autograd's thread-local grad mode does not reach the worker threads, and
// the GEMMs into buffers must not be recorded (the autograd lives in relation_ops.py).
torch::Tensor segment_product_sum(const torch::Tensor& x_in, const torch::Tensor& w_in, const torch::Tensor& idx,
                                  const torch::Tensor& t_ptr, const torch::Tensor& t_col,
                                  const c10::optional<torch::Tensor>& t_values, int64_t n_out) {
  const torch::Tensor x = x_in.detach(), w = w_in.detach();
  check(x, w, idx, t_ptr, t_col, t_values);
  const int64_t k = w.size(0), o = w.size(1), i = w.size(2), chunk = idx.numel() / k;
  const int threads = threads_for(k);
  // One output per thread (the first is the result), summed at the end.
  auto acc = torch::zeros({std::max(threads, 1), n_out, o}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "segment_product_sum", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const int64_t* ip = idx.data_ptr<int64_t>();
    const int64_t* pp = t_ptr.data_ptr<int64_t>();
    const int64_t* cp = t_col.data_ptr<int64_t>();
    const scalar_t* vp = t_values.has_value() ? t_values->data_ptr<scalar_t>() : nullptr;
    const int64_t n_edges = t_col.numel();
    std::vector<torch::Tensor> xbuf(threads), pbuf(threads);
    for (int t = 0; t < threads; ++t) {
      xbuf[t] = torch::empty({chunk, i}, x.options());
      pbuf[t] = torch::empty({chunk, o}, x.options());
    }
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      at::NoGradGuard no_grad;
      for (int64_t t = t0; t < t1; ++t) {
        scalar_t* out = acc[t].data_ptr<scalar_t>();
        const int64_t c0 = k * t / threads, c1 = k * (t + 1) / threads;
        for (int64_t c = c0; c < c1; ++c) {
          gather_rows(xp, ip + c * chunk, chunk, i, xbuf[t].data_ptr<scalar_t>());
          at::mm_out(pbuf[t], xbuf[t], w[c].t());
          const scalar_t* prod = pbuf[t].data_ptr<scalar_t>();
          for (int64_t p = 0; p < chunk; ++p) {
            const int64_t row = c * chunk + p;
            for (int64_t e = pp[row]; e < pp[row + 1]; ++e) {
              if (e + kAhead < n_edges) __builtin_prefetch(out + cp[e + kAhead] * o, 1);
              scalar_t* dst = out + cp[e] * o;
              const scalar_t* src = prod + p * o;
              if (vp == nullptr) {
                for (int64_t j = 0; j < o; ++j) dst[j] += src[j];
              } else {
                const scalar_t v = vp[e];
                for (int64_t j = 0; j < o; ++j) dst[j] += v * src[j];
              }
            }
          }
        }
      }
    });
  });
  return threads <= 1 ? acc[0] : acc.sum(0);
}

// The gradients of w (k, o, i) and, with need_x, of x (n_x, i), given the output's gradient g (n_out, o).
std::vector<torch::Tensor> segment_product_sum_backward(const torch::Tensor& g_in, const torch::Tensor& x_in,
                                                        const torch::Tensor& w_in, const torch::Tensor& idx,
                                                        const torch::Tensor& t_ptr, const torch::Tensor& t_col,
                                                        const c10::optional<torch::Tensor>& t_values,
                                                        bool need_x) {
  const torch::Tensor g = g_in.detach(), x = x_in.detach(), w = w_in.detach();
  check(x, w, idx, t_ptr, t_col, t_values);
  TORCH_CHECK(g.is_contiguous() && g.dim() == 2 && g.size(1) == w.size(1) && g.scalar_type() == x.scalar_type(),
              "relation_ops: the gradient (n_out, o), contiguous, of x's dtype");
  const int64_t k = w.size(0), o = w.size(1), i = w.size(2), chunk = idx.numel() / k;
  const int threads = threads_for(k);
  auto grad_w = torch::empty_like(w);
  torch::Tensor gx_acc = need_x ? torch::zeros({std::max(threads, 1), x.size(0), i}, x.options()) : torch::Tensor();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "segment_product_sum_backward", [&] {
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const int64_t* ip = idx.data_ptr<int64_t>();
    const int64_t* pp = t_ptr.data_ptr<int64_t>();
    const int64_t* cp = t_col.data_ptr<int64_t>();
    const scalar_t* vp = t_values.has_value() ? t_values->data_ptr<scalar_t>() : nullptr;
    const int64_t n_edges = t_col.numel();
    std::vector<torch::Tensor> xbuf(threads), gbuf(threads), gxbuf(threads);
    for (int t = 0; t < threads; ++t) {
      xbuf[t] = torch::empty({chunk, i}, x.options());
      gbuf[t] = torch::empty({chunk, o}, x.options());
      if (need_x) gxbuf[t] = torch::empty({chunk, i}, x.options());
    }
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      at::NoGradGuard no_grad;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t c0 = k * t / threads, c1 = k * (t + 1) / threads;
        for (int64_t c = c0; c < c1; ++c) {
          scalar_t* gb = gbuf[t].data_ptr<scalar_t>();
          for (int64_t p = 0; p < chunk; ++p) {  // the product row's gradient: its outputs' gradients, summed
            const int64_t row = c * chunk + p;
            scalar_t* dst = gb + p * o;
            for (int64_t j = 0; j < o; ++j) dst[j] = 0;
            for (int64_t e = pp[row]; e < pp[row + 1]; ++e) {
              if (e + kAhead < n_edges) __builtin_prefetch(gp + cp[e + kAhead] * o);
              const scalar_t* src = gp + cp[e] * o;
              const scalar_t v = vp == nullptr ? scalar_t(1) : vp[e];
              for (int64_t j = 0; j < o; ++j) dst[j] += v * src[j];
            }
          }
          gather_rows(xp, ip + c * chunk, chunk, i, xbuf[t].data_ptr<scalar_t>());
          auto gw = grad_w[c];
          at::mm_out(gw, gbuf[t].t(), xbuf[t]);
          if (need_x) {
            at::mm_out(gxbuf[t], gbuf[t], w[c]);
            scalar_t* gx = gx_acc[t].data_ptr<scalar_t>();
            const scalar_t* src = gxbuf[t].data_ptr<scalar_t>();
            for (int64_t p = 0; p < chunk; ++p) {
              if (p + kAhead < chunk) __builtin_prefetch(gx + ip[c * chunk + p + kAhead] * i, 1);
              scalar_t* dst = gx + ip[c * chunk + p] * i;
              for (int64_t j = 0; j < i; ++j) dst[j] += src[p * i + j];
            }
          }
        }
      }
    });
  });
  torch::Tensor grad_x = !need_x ? torch::Tensor() : (threads <= 1 ? gx_acc[0] : gx_acc.sum(0));
  return {grad_w, grad_x};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("segment_product_sum", &segment_product_sum, "fused gather, per-chunk GEMM and sum (forward)");
  m.def("segment_product_sum_backward", &segment_product_sum_backward, "its gradients of w and x");
}
