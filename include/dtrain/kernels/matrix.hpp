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

namespace dtrain {

// out(r, c) = row[c] for every row; run over out.size() indices.
template <Dtype T>
struct BroadcastRow {
  const T* row;
  MatView<T> out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    out.data[i] = row[static_cast<std::int64_t>(i) % out.cols];
  }
};

// out[c] = sum over rows of m(r, c), accumulated in fp32; run over m.cols indices.
template <Dtype T>
struct ColumnSum {
  MatView<const T> m;
  T* out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto c = static_cast<std::int64_t>(i);
    float acc = 0.f;
    for (std::int64_t r = 0; r < m.rows; ++r) acc += static_cast<float>(m(r, c));
    out[c] = dtype_cast<T>(acc);
  }
};

}  // namespace dtrain
