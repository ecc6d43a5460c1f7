#pragma once
// Shape checks shared by the nn units: a mismatch between a model's layers is
// the commonest user error, and caught here it names the unit and both shapes
// instead of surfacing as a BLAS error or an out-of-bounds access.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dtrain/core/error.hpp"
#include "dtrain/core/view.hpp"

namespace dtrain::nn::detail {

inline std::string shape_string(std::int64_t rows, std::int64_t cols) {
  return "[" + std::to_string(rows) + " x " + std::to_string(cols) + "]";
}

template <class T>
void check_shape(std::string_view unit, std::string_view what, const MatView<T>& v, std::int64_t rows,
                 std::int64_t cols) {
  if (v.rows != rows || v.cols != cols)
    throw config_error(std::string(unit) + ": " + std::string(what) + " is " + shape_string(v.rows, v.cols) +
                           ", expected " + shape_string(rows, cols),
                       "make consecutive units agree: each unit's input width is the previous unit's "
                       "out_features, and every view of a step has the same number of rows");
}

inline void check_count(std::string_view unit, std::string_view what, std::size_t got, std::size_t expected) {
  if (got != expected)
    throw config_error(std::string(unit) + ": got " + std::to_string(got) + " " + std::string(what) + ", expected " +
                           std::to_string(expected),
                       "pass one view per entry of the unit's params(), in declaration order");
}

// A unit whose output width equals its input width.
inline std::int64_t check_width(std::string_view unit, std::int64_t in, std::int64_t expected) {
  if (in != expected)
    throw config_error(std::string(unit) + " expects inputs of width " + std::to_string(expected) + ", got " +
                           std::to_string(in),
                       "set the unit's feature count to the previous unit's out_features");
  return expected;
}

}  // namespace dtrain::nn::detail
