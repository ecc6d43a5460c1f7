#pragma once
// Every rank must build the same model: the same parameters in the same
// order, shapes, trainability and initialisation, and the same seed. Checked
// when a Trainer is made, before any memory is spent on a wrong model, with
// the first parameter that differs named on every rank.

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/comm/world.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/wire.hpp"
#include "dtrain/model/layout.hpp"

namespace dtrain {

inline void check_same_model(World& world, const ModelLayout& layout, std::uint64_t seed) {
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
