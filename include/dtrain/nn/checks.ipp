// The definitions checks.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <cstdlib>

#include "dtrain/nn/checks.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn::detail {
  DTRAIN_DECL std::string shape_string(std::int64_t rows, std::int64_t cols) {
    return "[" + std::to_string(rows) + " x " + std::to_string(cols) + "]";
  }

  DTRAIN_DECL void shape_mismatch(std::string_view unit, std::string_view what, std::int64_t rows, std::int64_t cols,
                                  std::int64_t want_rows, std::int64_t want_cols) {
    throw config_error(std::string(unit) + ": " + std::string(what) + " is " + shape_string(rows, cols) +
                           ", expected " + shape_string(want_rows, want_cols),
                       "make consecutive units agree: each unit's input width is the previous unit's "
                       "out_features, and every view of a step has the same number of rows");
  }

  DTRAIN_DECL void count_mismatch(std::string_view unit, std::string_view what, std::size_t got, std::size_t expected) {
    throw config_error(std::string(unit) + ": got " + std::to_string(got) + " " + std::string(what) + ", expected " +
                           std::to_string(expected),
                       "pass one view per entry of the unit's params(), in declaration order");
  }

  DTRAIN_DECL void width_mismatch(std::string_view unit, std::int64_t in, std::int64_t expected) {
    throw config_error(
        std::string(unit) + " expects inputs of width " + std::to_string(expected) + ", got " + std::to_string(in),
        "set the unit's feature count to the previous unit's out_features");
  }

  DTRAIN_DECL void require_gpu_switch(std::string_view unit, std::string_view variable) {
    const std::string name(variable);
    const char* v = std::getenv(name.c_str());
    const std::string value = v != nullptr ? v : "";
    if (value == "on") return;
    if (value.empty() || value == "off")
      throw config_error(std::string(unit) + " on a GPU has not been proven on a GPU yet and is off",
                         "set " + name +
                             "=on to run its compiled GPU path anyway, or run it on dtrain::Host "
                             "(docs/gpu.md, Kernel paths)");
    throw config_error(name + "='" + value + "' is not one of off|on", "set " + name + " to off or on, or unset it");
  }

  DTRAIN_DECL void saved_shortfall(std::string_view unit, std::int64_t have, std::int64_t want, std::string_view fix) {
    throw config_error(std::string(unit) + ": " + std::to_string(have) + " saved elements for " + std::to_string(want),
                       std::string(fix));
  }

}  // namespace dtrain::nn::detail

DTRAIN_IMPL_END
