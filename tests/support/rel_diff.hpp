#pragma once
// Parameters by name, and the strategy tests' measure of how far two sets
// of them are apart: what "equal to world 1" means in every equivalence test.

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <support/ranks.hpp>

namespace dtrain::testing {

using Params = std::map<std::string, std::vector<float>>;

// Largest |a - b| / max(1, |b|) over every parameter; throws on a different set.
inline double max_rel_diff(const Params& a, const Params& b, std::string* where = nullptr) {
  require(a.size() == b.size(), "different parameter sets");
  double worst = 0;
  for (const auto& [name, va] : a) {
    const auto& vb = b.at(name);
    require(va.size() == vb.size(), "different sizes of " + name);
    for (std::size_t i = 0; i < va.size(); ++i) {
      const double d =
          std::abs(static_cast<double>(va[i]) - vb[i]) / std::max(1.0, std::abs(static_cast<double>(vb[i])));
      if (d > worst || std::isnan(d)) {
        worst = std::isnan(d) ? INFINITY : d;
        if (where)
          *where = name + "[" + std::to_string(i) + "] " + std::to_string(va[i]) + " vs " + std::to_string(vb[i]);
      }
    }
  }
  return worst;
}

}  // namespace dtrain::testing
