// The definitions rms_norm.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/nn/rms_norm.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  DTRAIN_DECL RMSNorm::RMSNorm(std::int64_t features, RmsNormOptions options) : features_(features), options_(options) {
    if (features < 1)
      throw config_error("nn::RMSNorm(" + std::to_string(features) + "): the feature count must be >= 1",
                         "give the width of the rows to normalise");
    if (!(options.eps > 0.f))
      throw config_error("nn::RMSNorm: eps must be > 0 (got " + std::to_string(options.eps) + ")",
                         "use the model's rms_norm_eps, e.g. 1e-6 or 1e-5");
  }

}  // namespace dtrain::nn

DTRAIN_IMPL_END
