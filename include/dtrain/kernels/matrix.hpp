#pragma once
// Row/column functors over row-major matrices, for bias-like parameters: a
// vector broadcast over every row (forward) and its gradient, the column sums
// (backward). Column sums run one index per column and walk down the rows:
// neighbouring GPU threads then read neighbouring addresses of each row.

#include <cstddef>
#include <cstdint>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/math.hpp"

namespace dtrain {

// out(r, c) = row[c] for every row; run over out.size() indices, or over
// out.rows with by_rows (the host, where the per-element division costs more
// than the copy): use broadcast_row, which picks.
template <Dtype T>
struct BroadcastRow {
  const T* row;
  MatView<T> out;
  bool by_rows = false;
  // for Host::for_each's split (index_work): a row per index by_rows
  std::size_t work_per_index() const { return by_rows ? static_cast<std::size_t>(out.cols) : 1; }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    if (by_rows) {
      T* dst = out.data + static_cast<std::int64_t>(i) * out.cols;
      for (std::int64_t c = 0; c < out.cols; ++c) dst[c] = row[c];
    } else {
      out.data[i] = row[static_cast<std::int64_t>(i) % out.cols];
    }
  }
};

template <class Dev, Dtype T>
void broadcast_row(Dev& dev, const T* row, MatView<T> out) {
  constexpr bool by_rows = Dev::host_accessible;
  dev.for_each(static_cast<std::size_t>(by_rows ? out.rows : out.rows * out.cols), BroadcastRow<T>{row, out, by_rows});
}

// out[c] = sum over rows of m(r, c), accumulated in fp32; run over
// column_groups(m.cols, group) indices (see math::column_sums), or use
// column_sum, which picks the group.
template <Dtype T>
struct ColumnSum {
  MatView<const T> m;
  T* out;
  std::int64_t group = 1;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(m.rows * group); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t c0 = static_cast<std::int64_t>(i) * group;
    const std::int64_t width = math::min_i64(group, m.cols - c0);
    const auto f = [this](std::int64_t r, std::int64_t c) { return static_cast<float>(m(r, c)); };
    const auto put = [this](std::int64_t c, float v) DTRAIN_LAMBDA_INLINE { out[c] = dtype_cast<T>(v); };
    if (group == math::lanes)
      math::column_sums<math::lanes>(m.rows, c0, width, f, put);
    else
      math::column_sums<1>(m.rows, c0, width, f, put);
  }
};

template <class Dev, Dtype T>
void column_sum(Dev& dev, MatView<const T> m, T* out) {
  constexpr std::int64_t group = column_group<Dev>();
  dev.for_each(column_groups(m.cols, group), ColumnSum<T>{m, out, group});
}

}  // namespace dtrain

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_MATRIX_FUNCTORS(EACH, SUM, T) \
  EACH(::dtrain::ColumnSum<T>)               \
  EACH(::dtrain::BroadcastRow<T>)
