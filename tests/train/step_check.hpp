#pragma once
// Gradients read from one SGD step with lr = 1 (before - after) against a
// float64 reference's, per parameter, within `tol` of the largest
// |parameter| + |gradient| of that parameter.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

namespace dtrain::testing {

using ParamValues = std::map<std::string, std::vector<float>>;

inline void check_sgd_step(const ParamValues& before, const ParamValues& after, const ParamValues& want, double tol,
                           const std::string& what) {
  for (const auto& [name, g] : want) {
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < g.size(); ++i)
      scale = std::max({scale, std::abs(double(g[i])), std::abs(double(before.at(name)[i]))});
    for (std::size_t i = 0; i < g.size(); ++i)
      worst = std::max(worst, std::abs(double(before.at(name)[i]) - after.at(name)[i] - g[i]));
    BOOST_TEST(worst <= tol * scale, what << ": " << name << " differs by " << worst << " (scale " << scale << ")");
  }
}

}  // namespace dtrain::testing
