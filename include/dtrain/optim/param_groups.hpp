#pragma once
// Parameter groups: parameters that share a learning rate and weight decay
// different from the optimizer's, as torch.optim's param_groups. The usual
// one leaves biases and norm gains out of weight decay:
//
//   dtrain::TrainerOptions o;
//   o.param_groups = {dtrain::no_decay_group()};            // tag:bias, tag:norm -> weight_decay 0
//   o.param_groups.push_back({.name = "head", .params = {"11.*"}, .lr = 1e-4f});
//
// A parameter belongs to the first group that selects it, else to the
// default group (the optimizer's own lr and weight_decay). A group's lr is
// its rate where the schedule is at the optimizer's lr: the schedule scales
// every group alike, as PyTorch's schedulers do.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/kernels/optimizer.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/optim/config.hpp"

namespace dtrain {

struct ParamGroup {
  std::string name;
  // Selectors, any of which selects a parameter: a glob over the layout name
  // "<unit>.<param>" (`*` any run of characters, `?` one: "*.bias",
  // "3.attn.*"), or "tag:NAME" for the tags units give their parameters
  // (dtrain's own: bias, norm, embedding).
  std::vector<std::string> params{};
  // A predicate over the parameter, for what names and tags cannot say
  // (e.g. every 1-D parameter of a user's units).
  std::function<bool(const ParamSlot&)> where{};
  std::optional<float> lr{};            // absent: the optimizer's lr
  std::optional<float> weight_decay{};  // absent: the optimizer's weight_decay
};

// Biases and normalisation gains without weight decay: what GPT-2, Llama and
// BERT recipes do.
DTRAIN_DECL ParamGroup no_decay_group();

// A group as resolved against a model: its absolute settings and members.
struct GroupSettings {
  std::string name;
  float lr = 0.f;  // at the optimizer's base rate
  float weight_decay = 0.f;
  std::vector<std::string> params;  // layout names, layout order
};

namespace detail {
// Glob match with `*` and `?` (iterative, backtracking to the last star).
DTRAIN_DECL bool glob_match(std::string_view pattern, std::string_view text);

DTRAIN_DECL bool selects(const ParamGroup& g, const ParamSlot& slot);
}  // namespace detail

// Which group each stored parameter is in. groups[0] is the default group;
// group_of[u][i] the group of units()[u].params[i].
struct GroupPlan {
  std::vector<GroupSettings> groups;
  std::vector<std::vector<std::uint8_t>> group_of;

  std::size_t size() const { return groups.size(); }
};

// Resolves `groups` against `layout` with the optimizer's defaults. A group
// that selects no trainable parameter is an error (a typo in a pattern would
// otherwise change nothing, silently).
DTRAIN_DECL GroupPlan plan_groups(const ModelLayout& layout, const std::vector<ParamGroup>& groups, float lr,
                                  float weight_decay);

// The group id of every element of a strategy's owned flat, from its
// ownership ranges (padding takes the default group).
template <class Range>
std::vector<std::uint8_t> element_groups(const ModelLayout& layout, const GroupPlan& plan,
                                         const std::vector<Range>& owned, std::size_t size) {
  std::vector<std::uint8_t> ids(size, 0);
  for (const Range& r : owned) {
    const UnitSlots& unit = layout.units()[r.unit];
    for (std::size_t i = 0; i < unit.params.size(); ++i) {
      const ParamSlot& slot = unit.params[i];
      if (!slot.spec.trainable) continue;
      const std::size_t first = slot.offset - unit.train_offset;
      const std::size_t last = first + static_cast<std::size_t>(slot.spec.numel());
      const std::size_t lo = std::max(first, r.begin), hi = std::min(last, r.begin + r.count);
      for (std::size_t e = lo; e < hi; ++e) ids[r.offset + (e - r.begin)] = plan.group_of[r.unit][i];
    }
  }
  return ids;
}

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/optim/param_groups.ipp"
#endif
