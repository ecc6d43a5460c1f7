// The definitions drop_tokens.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/nn/drop_tokens.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  DTRAIN_DECL void DropTokens::too_short(std::int64_t time) const {
    throw config_error("nn::DropTokens: sequences of " + std::to_string(time) + " tokens, and " +
                           std::to_string(count_) + " to drop from each",
                       "drop fewer tokens than a sequence has (a vision tower's class token: 1)");
  }
}  // namespace dtrain::nn

DTRAIN_IMPL_END
