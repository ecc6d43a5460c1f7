// The definitions step_guard.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/train/step_guard.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::detail {
  DTRAIN_DECL std::string first_nonfinite_text(World & world, const NonfiniteAt& mine) {
    NonfiniteAt first;
    for (const NonfiniteAt& a : world.all_gather("nonfinite-unit", mine))
      if (a.key < first.key) first = a;
    if (first.key == std::numeric_limits<std::uint64_t>::max())
      return "every gradient element is finite (the loss is not)";
    return "the first non-finite gradient is in " + first.name;
  }

}  // namespace dtrain::detail

DTRAIN_IMPL_END
