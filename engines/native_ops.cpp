// neurovec's segment reductions as torch operators, their autograd in C++.
//
// The kernels of native_kernels.h registered with torch's dispatcher in the namespace
// neurovec_cpu, each with a CPU kernel and an Autograd kernel (a torch::autograd::Function).
// On small graphs a training step is mostly per-call overhead: from Python a call costs
// ~2 µs of dispatch, where a Python autograd.Function costs ~6 µs forward and runs Python
// again in the backward (see NOTE: [Operators in C++] in engines/ops.py).
//
// Built on first use by engines/native.py with torch's headers and linked to libtorch
// (no Python headers), cached per source hash and torch version, loaded with
// torch.ops.load_library. Where it cannot be built, engines/ops.py calls the same kernels
// through ctypes (native_kernels.cpp) from Python autograd Functions.
//
// Index tensors are int32 or int64 (AT_DISPATCH_INDEX_TYPES); values float32 or float64.
// The ops trust what the compiler guarantees: ptr is sorted from 0 to the number of
// entries, col indexes rows of x.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/div.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/segment_reduce.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace {

// The tasks of native_kernels.h's for_segments run on torch's intra-op threads (at::parallel_for):
// the threads torch's own ops use, as many as torch.get_num_threads(), one at a time inside another
// parallel region. See NOTE: [threads on a busy machine] in engines/native.py.
template <typename Task>
void run_tasks(int64_t n_tasks, const Task& task) {
    at::parallel_for(0, n_tasks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) task(i);
    });
}

}  // namespace

#include "native_kernels.h"

namespace {

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

// y[j] = sum_{e in ptr[j]..ptr[j+1]} values[e] * x[col[e]] / divide[j]; without col, row e.
Tensor csr_sum(const Tensor& x_in, const Tensor& ptr_in, const Tensor& col_in, const OptionalTensor& values_in,
               const OptionalTensor& divide_in) {
    check_values(x_in, "csr_sum");
    const Tensor x = x_in.contiguous(), ptr = ptr_in.contiguous();
    const Tensor col = col_in.defined() ? as(col_in, ptr.scalar_type()) : Tensor();
    const Tensor values = like(values_in, x), divide = like(divide_in, x);
    const int64_t n = ptr.size(0) - 1;
    Tensor y = at::empty(with_rows(x, n), x.options());
    const int threads = at::get_num_threads();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::csr_sum", [&] {
        AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "neurovec_cpu::csr_sum", [&] {
            segment_sum<scalar_t, index_t>(n, ptr.data_ptr<index_t>(), data_or_null<index_t>(col),
                                           data_or_null<scalar_t>(values), x.data_ptr<scalar_t>(), row_width(x),
                                           y.data_ptr<scalar_t>(), data_or_null<scalar_t>(divide), threads);
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
    Tensor out = at::empty(with_rows(g, n_entries), g.options());
    const int threads = at::get_num_threads();
    AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "neurovec_cpu::segment_broadcast", [&] {
        AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "neurovec_cpu::segment_broadcast", [&] {
            segment_broadcast<scalar_t, index_t>(ptr.size(0) - 1, ptr.data_ptr<index_t>(),
                                                 data_or_null<scalar_t>(values), g.data_ptr<scalar_t>(),
                                                 row_width(g), out.data_ptr<scalar_t>(),
                                                 data_or_null<scalar_t>(divide), threads);
        });
    });
    return out;
}

Tensor extremum(const Tensor& x_in, const Tensor& ptr_in, bool max) {
    check_values(x_in, max ? "segment_max" : "segment_min");
    const Tensor x = x_in.contiguous(), ptr = ptr_in.contiguous();
    const int64_t n = ptr.size(0) - 1;
    Tensor y = at::empty(with_rows(x, n), x.options());
    const int threads = at::get_num_threads();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::segment_extremum", [&] {
        AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "neurovec_cpu::segment_extremum", [&] {
            const index_t* p = ptr.data_ptr<index_t>();
            if (max) segment_extremum<true, scalar_t, index_t>(n, p, nullptr, x.data_ptr<scalar_t>(), row_width(x),
                                                                y.data_ptr<scalar_t>(), threads);
            else segment_extremum<false, scalar_t, index_t>(n, p, nullptr, x.data_ptr<scalar_t>(), row_width(x),
                                                            y.data_ptr<scalar_t>(), threads);
        });
    });
    return y;
}

// The gradient of a segment max / min: ties share it (mask * (grad / ties)[segment]).
Tensor extremum_backward(const Tensor& grad_in, const Tensor& x_in, const Tensor& y_in, const Tensor& ptr_in) {
    check_values(x_in, "segment_extremum_backward");
    const Tensor x = x_in.contiguous(), y = y_in.contiguous(), ptr = ptr_in.contiguous();
    const Tensor grad = as(grad_in, x.scalar_type());
    Tensor out = at::empty_like(x), ties = at::empty_like(y);  // ties: scratch for widths without registers
    const int threads = at::get_num_threads();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "neurovec_cpu::segment_extremum_backward", [&] {
        AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "neurovec_cpu::segment_extremum_backward", [&] {
            segment_extremum_backward<scalar_t, index_t>(ptr.size(0) - 1, ptr.data_ptr<index_t>(),
                                                         x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                                         grad.data_ptr<scalar_t>(), row_width(x),
                                                         out.data_ptr<scalar_t>(), ties.data_ptr<scalar_t>(), threads);
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

Tensor segment_broadcast_autograd(const Tensor& g, const Tensor& ptr, const OptionalTensor& values,
                                  const OptionalTensor& divide, int64_t n_entries) {
    if (!needs_graph(g)) return broadcast(g, ptr, values, divide, n_entries);
    return SegmentBroadcast::apply(g, ptr, values, divide, n_entries);
}

Tensor segment_extremum_autograd(const Tensor& x, const Tensor& ptr, bool max) {
    if (!needs_graph(x)) return extremum(x, ptr, max);
    return SegmentExtremum::apply(x, ptr, max);
}

}  // namespace

TORCH_LIBRARY(neurovec_cpu, m) {
    m.def("gather_sum(Tensor x, Tensor ptr, Tensor col, Tensor? values, Tensor t_ptr, Tensor t_col, "
          "Tensor? t_values, Tensor? bias=None) -> Tensor");
    m.def("segment_sum(Tensor x, Tensor ptr, Tensor? values, Tensor? divide) -> Tensor");
    m.def("segment_broadcast(Tensor g, Tensor ptr, Tensor? values, Tensor? divide, int n_entries) -> Tensor");
    m.def("segment_extremum(Tensor x, Tensor ptr, bool max) -> Tensor");
}

TORCH_LIBRARY_IMPL(neurovec_cpu, CPU, m) {
    m.impl("gather_sum", gather_sum_cpu);
    m.impl("segment_sum", segment_sum_cpu);
    m.impl("segment_broadcast", broadcast);
    m.impl("segment_extremum", extremum);
}

TORCH_LIBRARY_IMPL(neurovec_cpu, Autograd, m) {
    m.impl("gather_sum", gather_sum_autograd);
    m.impl("segment_sum", segment_sum_autograd);
    m.impl("segment_broadcast", segment_broadcast_autograd);
    m.impl("segment_extremum", segment_extremum_autograd);
}
