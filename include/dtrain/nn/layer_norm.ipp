// The definitions layer_norm.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/nn/layer_norm.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  DTRAIN_DECL LayerNorm::LayerNorm(std::int64_t features, LayerNormOptions options)
      : features_(features), options_(options) {
    if (features < 1)
      throw config_error("nn::LayerNorm(" + std::to_string(features) + "): the feature count must be >= 1",
                         "give the width of the rows to normalise");
  }

}  // namespace dtrain::nn

DTRAIN_IMPL_END
