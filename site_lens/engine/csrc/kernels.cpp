// C++ kernels for the last-token path (site_lens/engine/kernels.py): one-row and few-row matrix products, RMSNorm.
//
// A batch-1 SITE step multiplies one activation row by every weight matrix,
// forward (x @ W) and backward (g @ W^T). Both only stream W once, so they are
// bound by memory bandwidth; MKL reaches 11-25 GB/s on these shapes and uses
// one core. These loops stream W in its stored, input-major (K, N) order and
// split the rows of W between threads, so both directions read contiguous
// memory on every core.
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

// acc[n] += sum_{k0 <= k < k1} x[k] * W[k, n], eight rows of W per pass over acc: the accumulator
// is read and written once per eight rows, so the loop is bound by streaming W (1.5-1.8x faster
// than one row per pass, measured; BENCHMARKS.md)
void axpy_rows(const float* x, const float* w, float* acc, int64_t k0, int64_t k1, int64_t n) {
  int64_t k = k0;
  for (; k + 8 <= k1; k += 8) {
    const float* r = w + k * n;
    const float a0 = x[k], a1 = x[k + 1], a2 = x[k + 2], a3 = x[k + 3];
    const float a4 = x[k + 4], a5 = x[k + 5], a6 = x[k + 6], a7 = x[k + 7];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j)
      acc[j] += ((a0 * r[j] + a1 * r[n + j]) + (a2 * r[2 * n + j] + a3 * r[3 * n + j])) +
                ((a4 * r[4 * n + j] + a5 * r[5 * n + j]) + (a6 * r[6 * n + j] + a7 * r[7 * n + j]));
  }
  for (; k < k1; ++k) {
    const float a = x[k];
    const float* row = w + k * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) acc[j] += a * row[j];
  }
}

constexpr int64_t kMinParallel = 1 << 16;  // below this many weights one thread is faster

void check(const torch::Tensor& row, const torch::Tensor& w, int64_t len) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == torch::kFloat && w.device().is_cpu(),
              "row_matmul: W must be a contiguous float32 CPU matrix");
  TORCH_CHECK(row.dim() == 2 && row.size(0) == 1 && row.size(1) == len && row.is_contiguous() &&
                  row.scalar_type() == torch::kFloat && row.device().is_cpu(),
              "row_matmul: the row must be a contiguous float32 CPU tensor of shape (1, ", len, ")");
}

}  // namespace

// y = x @ W: x (1, K), W (K, N) -> (1, N)
torch::Tensor row_times(torch::Tensor x, torch::Tensor w, int64_t threads) {
  const int64_t K = w.size(0), N = w.size(1);
  check(x, w, K);
  auto y = torch::zeros({1, N}, w.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t T = std::min<int64_t>(threads, K);
  if (T <= 1 || K * N < kMinParallel) {
    axpy_rows(xp, wp, yp, 0, K, N);
    return y;
  }
  std::vector<float> part((T - 1) * N, 0.f);  // thread t > 0 sums its rows here
#pragma omp parallel num_threads(T)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    float* acc = t == 0 ? yp : part.data() + (t - 1) * N;
    axpy_rows(xp, wp, acc, K * t / nt, K * (t + 1) / nt, N);
  }
  for (int64_t t = 1; t < T; ++t) {
    const float* p = part.data() + (t - 1) * N;
    for (int64_t j = 0; j < N; ++j) yp[j] += p[j];
  }
  return y;
}

// g = d @ W^T: d (1, N), W (K, N) -> (1, K)
torch::Tensor row_times_t(torch::Tensor d, torch::Tensor w, int64_t threads) {
  const int64_t K = w.size(0), N = w.size(1);
  check(d, w, N);
  auto g = torch::empty({1, K}, w.options());
  const float* dp = d.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* gp = g.data_ptr<float>();
  const int64_t T = std::max<int64_t>(1, std::min<int64_t>(threads, K));
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1 && K * N >= kMinParallel)
  for (int64_t k = 0; k < K; ++k) {
    const float* row = wp + k * N;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < N; ++j) s += row[j] * dp[j];
    gp[k] = s;
  }
  return g;
}

// A few rows at once (the sequence objective's last prompt token and answer tokens): W is still
// streamed once. Columns go in tiles of kTile, so a tile of W's rows and every row's accumulator
// for it stay in L1 while W's rows stream past; threads take whole tiles, so need no partial sums.
constexpr int64_t kTile = 256;
constexpr int64_t kMaxRows = 32;  // above this ATen's blocked product wins (kernels.py routes there)

void check_rows(const torch::Tensor& rows, const torch::Tensor& w, int64_t len) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == torch::kFloat && w.device().is_cpu(),
              "rows_matmul: W must be a contiguous float32 CPU matrix");
  TORCH_CHECK(rows.dim() == 2 && rows.size(0) >= 1 && rows.size(0) <= kMaxRows && rows.size(1) == len &&
                  rows.is_contiguous() && rows.scalar_type() == torch::kFloat && rows.device().is_cpu(),
              "rows_matmul: the rows must be a contiguous float32 CPU tensor of shape (1..", kMaxRows, ", ", len, ")");
}

// y = x @ W: x (M, K), W (K, N) -> (M, N); each row's sums in the order of a one-thread row_times
torch::Tensor rows_times(torch::Tensor x, torch::Tensor w, int64_t threads) {
  const int64_t K = w.size(0), N = w.size(1), M = x.size(0);
  check_rows(x, w, K);
  auto y = torch::zeros({M, N}, w.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t tiles = (N + kTile - 1) / kTile;
  const int64_t T = std::max<int64_t>(1, std::min<int64_t>(threads, tiles));
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1 && M * K * N >= kMinParallel)
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t j0 = tile * kTile, jn = std::min(kTile, N - j0);
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      const float* r = wp + k * N + j0;
      for (int64_t m = 0; m < M; ++m) {
        const float* a = xp + m * K + k;
        float* acc = yp + m * N + j0;
#pragma omp simd
        for (int64_t j = 0; j < jn; ++j)
          acc[j] += ((a[0] * r[j] + a[1] * r[N + j]) + (a[2] * r[2 * N + j] + a[3] * r[3 * N + j])) +
                    ((a[4] * r[4 * N + j] + a[5] * r[5 * N + j]) + (a[6] * r[6 * N + j] + a[7] * r[7 * N + j]));
      }
    }
    for (; k < K; ++k) {
      const float* row = wp + k * N + j0;
      for (int64_t m = 0; m < M; ++m) {
        const float a = xp[m * K + k];
        float* acc = yp + m * N + j0;
#pragma omp simd
        for (int64_t j = 0; j < jn; ++j) acc[j] += a * row[j];
      }
    }
  }
  return y;
}

// g = d @ W^T: d (M, N), W (K, N) -> (M, K). Column tiles outermost: a tile of every row of d stays
// in L1 while the same columns of W's rows stream past (each element of W is read once)
torch::Tensor rows_times_t(torch::Tensor d, torch::Tensor w, int64_t threads) {
  const int64_t K = w.size(0), N = w.size(1), M = d.size(0);
  check_rows(d, w, N);
  auto g = torch::zeros({M, K}, w.options());
  const float* dp = d.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* gp = g.data_ptr<float>();
  const int64_t T = std::max<int64_t>(1, std::min<int64_t>(threads, K));
#pragma omp parallel num_threads(T) if (T > 1 && M * K * N >= kMinParallel)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t k0 = K * t / nt, k1 = K * (t + 1) / nt;  // each thread its own outputs: no partial sums
    for (int64_t j0 = 0; j0 < N; j0 += kTile) {
      const int64_t jn = std::min(kTile, N - j0);
      for (int64_t k = k0; k < k1; ++k) {
        const float* row = wp + k * N + j0;
        for (int64_t m = 0; m < M; ++m) {
          const float* dm = dp + m * N + j0;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j < jn; ++j) s += row[j] * dm[j];
          gp[m * K + k] += s;
        }
      }
    }
  }
  return g;
}

// Autograd in C++: a Python autograd.Function costs ~20 us a call, a fifth of a small product.
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

struct RowMatmul : public torch::autograd::Function<RowMatmul> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor w, int64_t threads) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["threads"] = threads;
    return row_times(x, w, threads);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const int64_t threads = ctx->saved_data["threads"].toInt();
    torch::Tensor gx, gw;
    if (ctx->needs_input_grad(0))  // with create_graph, ATen's product so that the gradient has a graph
      gx = torch::GradMode::is_enabled() ? grads[0].mm(saved[1].t()) : row_times_t(grads[0].contiguous(), saved[1], threads);
    if (ctx->needs_input_grad(1)) gw = saved[0].t().mm(grads[0]);  // a frozen model never asks for this
    return {gx, gw, torch::Tensor()};
  }
};

struct RowsMatmul : public torch::autograd::Function<RowsMatmul> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor w, int64_t threads) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["threads"] = threads;
    return rows_times(x, w, threads);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const int64_t threads = ctx->saved_data["threads"].toInt();
    torch::Tensor gx, gw;
    if (ctx->needs_input_grad(0))  // with create_graph, ATen's product so that the gradient has a graph
      gx = torch::GradMode::is_enabled() ? grads[0].mm(saved[1].t()) : rows_times_t(grads[0].contiguous(), saved[1], threads);
    if (ctx->needs_input_grad(1)) gw = saved[0].t().mm(grads[0]);  // a frozen model never asks for this
    return {gx, gw, torch::Tensor()};
  }
};

// y = x / sqrt(mean(x^2) + eps) over the last dim (no weight: lasttoken folds it into the next matrix).
// Backward: gx = r * (g - y * mean(g * y)), r = 1 / sqrt(mean(x^2) + eps). Plain loops for contiguous
// float32 rows (one pass each way instead of five ATen ops); ATen ops for anything else.
struct RmsNorm : public torch::autograd::Function<RmsNorm> {
  static bool plain(const torch::Tensor& x) {
    return x.scalar_type() == torch::kFloat && x.is_contiguous() && x.device().is_cpu() && x.dim() >= 1;
  }
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, double eps) {
    torch::Tensor y, r;
    if (plain(x)) {
      const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
      y = torch::empty_like(x);
      auto rshape = x.sizes().vec();
      rshape.back() = 1;
      r = torch::empty(rshape, x.options());
      const float* xp = x.data_ptr<float>();
      float *yp = y.data_ptr<float>(), *rp = r.data_ptr<float>();
      for (int64_t i = 0; i < rows; ++i) {
        const float* xi = xp + i * n;
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < n; ++j) ss += xi[j] * xi[j];
        const float ri = 1.f / std::sqrt(ss / n + static_cast<float>(eps));
        rp[i] = ri;
        for (int64_t j = 0; j < n; ++j) yp[i * n + j] = xi[j] * ri;
      }
    } else {
      r = (x.square().mean(-1, true) + eps).rsqrt();
      y = x * r;
    }
    ctx->save_for_backward({y, r, x});
    ctx->saved_data["eps"] = eps;
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& y = saved[0];
    const auto& r = saved[1];
    auto g = grads[0].contiguous();
    if (torch::GradMode::is_enabled()) {  // create_graph: recompute r and y from x with ATen ops, so both have a graph
      const auto& x = saved[2];
      auto rx = (x.square().mean(-1, true) + ctx->saved_data["eps"].toDouble()).rsqrt();
      auto yx = x * rx;
      return {rx * (g - yx * (g * yx).mean(-1, true)), torch::Tensor()};
    }
    if (!(plain(y) && plain(g))) return {r * (g - y * (g * y).mean(-1, true)), torch::Tensor()};
    const int64_t n = y.size(-1), rows = y.numel() / std::max<int64_t>(n, 1);
    auto gx = torch::empty_like(y);
    const float *yp = y.data_ptr<float>(), *gp = g.data_ptr<float>(), *rp = r.data_ptr<float>();
    float* op = gx.data_ptr<float>();
    for (int64_t i = 0; i < rows; ++i) {
      const float *yi = yp + i * n, *gi = gp + i * n;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < n; ++j) dot += gi[j] * yi[j];
      const float m = dot / n, ri = rp[i];
      for (int64_t j = 0; j < n; ++j) op[i * n + j] = ri * (gi[j] - yi[j] * m);
    }
    return {gx, torch::Tensor()};
  }
};

torch::Tensor row_matmul(torch::Tensor x, torch::Tensor w, int64_t threads) { return RowMatmul::apply(x, w, threads); }
torch::Tensor rows_matmul(torch::Tensor x, torch::Tensor w, int64_t threads) { return RowsMatmul::apply(x, w, threads); }
torch::Tensor rms_norm(torch::Tensor x, double eps) { return RmsNorm::apply(x, eps); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("row_times", &row_times, "x @ W for one row x");
  m.def("row_times_t", &row_times_t, "d @ W^T for one row d");
  m.def("row_matmul", &row_matmul, "x @ W for one row x, differentiable in x");
  m.def("rows_times", &rows_times, "x @ W for a few rows x");
  m.def("rows_times_t", &rows_times_t, "d @ W^T for a few rows d");
  m.def("rows_matmul", &rows_matmul, "x @ W for a few rows x, differentiable in x");
  m.def("rms_norm", &rms_norm, "x / sqrt(mean(x^2) + eps), differentiable");
}
