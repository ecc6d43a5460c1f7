#pragma once
// Which units activation checkpointing recomputes: the one rule the
// Trainer's pipeline (train/pipeline.hpp) and the estimate
// (train/estimate.hpp, dtrain-estimate) share.
//
// A recomputed unit gives up its own saved buffer: the recomputed units
// share one buffer of the largest size among them, which each refills in
// its turn during backward. Of the units that keep anything (saved > 0):
//   - every `every`-th (1: all), counting from the first;
//   - or exactly `units` (unit numbers), when given;
//   - or, with a `budget_bytes`, the fewest units (the largest first: a
//     transformer's blocks are equal, so the first ones) for which what
//     the others keep plus the shared buffer fits the budget.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain {

struct RecomputePolicy {
  bool on = false;                   // TrainerOptions::activation_checkpointing
  std::size_t every = 1;             // checkpoint_every
  std::vector<std::size_t> units{};  // checkpoint_units
  std::size_t budget_bytes = 0;      // checkpoint_budget_bytes (0: none)
};

namespace detail {

// Refuses a policy that says two things at once (TrainerOptions' names).
DTRAIN_DECL void check_recompute_policy(const RecomputePolicy& p, std::size_t num_units);

// saved[u]: the elements unit u keeps for backward at this batch shape;
// element_bytes: their size. 1 where unit u is recomputed.
DTRAIN_DECL std::vector<char> recomputed_units(const std::vector<std::int64_t>& saved, std::size_t element_bytes,
                                               const RecomputePolicy& p);

}  // namespace detail
}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/train/recompute.ipp"
#endif
