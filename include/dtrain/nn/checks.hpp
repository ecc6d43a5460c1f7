#pragma once
// Shape checks shared by the nn units: a mismatch between a model's layers is
// the commonest user error, and caught here it names the unit and both shapes
// instead of surfacing as a BLAS error or an out-of-bounds access.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"

namespace dtrain::nn::detail {

DTRAIN_DECL std::string shape_string(std::int64_t rows, std::int64_t cols);

// The errors of the checks below, out of line: the checks run in every
// unit's forward and backward, and only their comparisons need inlining.
[[noreturn]] DTRAIN_DECL void shape_mismatch(std::string_view unit, std::string_view what, std::int64_t rows,
                                             std::int64_t cols, std::int64_t want_rows, std::int64_t want_cols);
[[noreturn]] DTRAIN_DECL void count_mismatch(std::string_view unit, std::string_view what, std::size_t got,
                                             std::size_t expected);
[[noreturn]] DTRAIN_DECL void width_mismatch(std::string_view unit, std::int64_t in, std::int64_t expected);
// Throws unless the environment variable `variable` is "on": a unit's GPU
// path that no GPU run has proven yet (a device whose buffers the host
// cannot read) runs only when asked to (docs/gpu.md, Kernel paths).
DTRAIN_DECL void require_gpu_switch(std::string_view unit, std::string_view variable);
[[noreturn]] DTRAIN_DECL void saved_shortfall(std::string_view unit, std::int64_t have, std::int64_t want,
                                              std::string_view fix);

template <class T>
void check_shape(std::string_view unit, std::string_view what, const MatView<T>& v, std::int64_t rows,
                 std::int64_t cols) {
  if (v.rows != rows || v.cols != cols) shape_mismatch(unit, what, v.rows, v.cols, rows, cols);
}

inline void check_count(std::string_view unit, std::string_view what, std::size_t got, std::size_t expected) {
  if (got != expected) count_mismatch(unit, what, got, expected);
}

// A unit whose output width equals its input width.
inline std::int64_t check_width(std::string_view unit, std::int64_t in, std::int64_t expected) {
  if (in != expected) width_mismatch(unit, in, expected);
  return expected;
}

// A call's saved view (UnitContext::saved) holds at least what the unit
// keeps; `fix` says how the caller sizes it.
inline void check_saved(std::string_view unit, std::int64_t have, std::int64_t want, std::string_view fix) {
  if (have < want) saved_shortfall(unit, have, want, fix);
}

}  // namespace dtrain::nn::detail

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/checks.ipp"
#endif
