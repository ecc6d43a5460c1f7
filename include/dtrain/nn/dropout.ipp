// The definitions dropout.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/nn/dropout.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  DTRAIN_DECL Dropout::Dropout(float p) : p_(p) {
    if (!(p >= 0.f && p < 1.f))
      throw config_error("nn::Dropout(" + std::to_string(p) + "): the drop probability must be in [0, 1)",
                         "use e.g. 0.1, or 0 for none");
  }

}  // namespace dtrain::nn

DTRAIN_IMPL_END
