// The definitions model_check.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/train/model_check.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL void check_same_model(World & world, const ModelLayout& layout, std::uint64_t seed) {
    const std::vector<std::vector<std::string>> all = world.all_gather("model-signature", layout.signature());
    for (int r = 1; r < world.size(); ++r) {
      const auto& theirs = all[static_cast<std::size_t>(r)];
      if (!wire::first_difference(all[0], theirs)) continue;
      std::size_t i = 0;
      while (i < all[0].size() && i < theirs.size() && all[0][i] == theirs[i]) ++i;
      const auto at = [i](const std::vector<std::string>& s) { return i < s.size() ? s[i] : std::string("<missing>"); };
      throw config_error("rank " + world.describe_rank(r) + " built a different model than rank 0: first difference " +
                             "at parameter '" + at(theirs) + "' where rank 0 has '" + at(all[0]) + "'",
                         "every rank must construct the same model (same config, same code)");
    }
    world.agree("TrainerOptions::seed", seed);
  }

}  // namespace dtrain

DTRAIN_IMPL_END
