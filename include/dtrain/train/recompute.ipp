// The definitions recompute.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/train/recompute.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::detail {
  DTRAIN_DECL void check_recompute_policy(const RecomputePolicy& p, std::size_t num_units) {
    if (p.every == 0)
      throw config_error("TrainerOptions::checkpoint_every is 0", "give 1 (every unit that keeps activations) or more");
    for (std::size_t u : p.units)
      if (u >= num_units)
        throw config_error("TrainerOptions::checkpoint_units names unit " + std::to_string(u) + "; the model has " +
                               std::to_string(num_units) + " units (0.." + std::to_string(num_units - 1) + ")",
                           "name units of this model");
    const int ways = (p.every != 1) + !p.units.empty() + (p.budget_bytes != 0);
    if (ways > 1)
      throw config_error(
          "TrainerOptions gives more than one of checkpoint_every, checkpoint_units and "
          "checkpoint_budget_bytes",
          "choose the recomputed units one way");
  }

  DTRAIN_DECL std::vector<char> recomputed_units(const std::vector<std::int64_t>& saved, std::size_t element_bytes,
                                                 const RecomputePolicy& p) {
    const std::size_t n = saved.size();
    std::vector<char> r(n, 0);
    if (!p.on) return r;
    if (!p.units.empty()) {
      for (std::size_t u : p.units) r.at(u) = 1;
      return r;
    }
    if (p.budget_bytes == 0) {
      std::size_t seen = 0;
      for (std::size_t u = 0; u < n; ++u)
        if (saved[u] > 0) r[u] = seen++ % std::max<std::size_t>(p.every, 1) == 0;
      return r;
    }
    const auto bytes = [&](std::size_t u) { return static_cast<std::size_t>(saved[u]) * element_bytes; };
    std::vector<std::size_t> order;
    for (std::size_t u = 0; u < n; ++u)
      if (saved[u] > 0) order.push_back(u);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return saved[a] > saved[b]; });
    std::size_t kept = 0;
    for (std::size_t u : order) kept += bytes(u);
    if (kept <= p.budget_bytes) return r;  // everything fits: nothing recomputed
    // Recompute the largest first: the shared buffer is the first one's size.
    const std::size_t shared = order.empty() ? 0 : bytes(order.front());
    for (std::size_t u : order) {
      r[u] = 1;
      kept -= bytes(u);
      if (kept + shared <= p.budget_bytes) return r;
    }
    throw config_error("checkpoint_budget_bytes " + std::to_string(p.budget_bytes) +
                           " is below what one unit keeps for backward at this batch shape (" + std::to_string(shared) +
                           " bytes, with every unit recomputed)",
                       "raise checkpoint_budget_bytes to at least " + std::to_string(shared) +
                           ", or train smaller micro-batches (batch_size, block_size)");
  }

}  // namespace dtrain::detail

DTRAIN_IMPL_END
