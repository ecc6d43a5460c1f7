// The definitions param_groups.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/optim/param_groups.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL ParamGroup no_decay_group() {
    return {.name = "no_decay", .params = {"tag:bias", "tag:norm"}, .weight_decay = 0.f};
  }
}  // namespace dtrain

namespace dtrain {

namespace detail {

DTRAIN_DECL bool glob_match(std::string_view pattern, std::string_view text) {
  std::size_t p = 0, t = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p, ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

DTRAIN_DECL bool selects(const ParamGroup& g, const ParamSlot& slot) {
  if (g.where && g.where(slot)) return true;
  for (const std::string& sel : g.params) {
    if (sel.starts_with("tag:")) {
      const std::string_view tag = std::string_view(sel).substr(4);
      for (const std::string& t : slot.spec.tags)
        if (t == tag) return true;
    } else if (glob_match(sel, slot.name)) {
      return true;
    }
  }
  return false;
}
}  // namespace detail

DTRAIN_DECL GroupPlan plan_groups(const ModelLayout& layout, const std::vector<ParamGroup>& groups, float lr,
                                  float weight_decay) {
  if (groups.size() + 1 > max_param_groups)
    throw config_error(std::to_string(groups.size()) + " parameter groups are more than the " +
                           std::to_string(max_param_groups - 1) + " an optimizer takes beside its default group",
                       "merge groups that share lr and weight_decay");
  GroupPlan plan;
  plan.groups.push_back({"default", lr, weight_decay, {}});
  for (const ParamGroup& g : groups) {
    if (g.name.empty() || g.name == "default")
      throw config_error("a parameter group is named '" + g.name + "'",
                         "give every group a name of its own ('default' is the optimizer's)");
    for (const GroupSettings& seen : plan.groups)
      if (seen.name == g.name)
        throw config_error("two parameter groups are named '" + g.name + "'", "give every group a name of its own");
    if (g.params.empty() && !g.where)
      throw config_error("parameter group '" + g.name + "' selects nothing",
                         "give it .params (globs over \"<unit>.<param>\", or \"tag:NAME\") or a .where predicate");
    const float glr = g.lr.value_or(lr), gwd = g.weight_decay.value_or(weight_decay);
    detail::check_field("ParamGroup '" + g.name + "'", "lr", glr, detail::positive);
    detail::check_field("ParamGroup '" + g.name + "'", "weight_decay", gwd, detail::non_negative);
    plan.groups.push_back({g.name, glr, gwd, {}});
  }
  plan.group_of.resize(layout.units().size());
  for (std::size_t u = 0; u < layout.units().size(); ++u) {
    const auto& params = layout.units()[u].params;
    plan.group_of[u].assign(params.size(), 0);
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!params[i].spec.trainable) continue;
      for (std::size_t k = 0; k < groups.size(); ++k)
        if (detail::selects(groups[k], params[i])) {
          plan.group_of[u][i] = static_cast<std::uint8_t>(k + 1);
          break;
        }
      plan.groups[plan.group_of[u][i]].params.push_back(params[i].name);
    }
  }
  for (std::size_t k = 1; k < plan.groups.size(); ++k)
    if (plan.groups[k].params.empty())
      throw config_error("parameter group '" + plan.groups[k].name + "' selects no trainable parameter",
                         "check its patterns against the layout names (\"<unit>.<param>\", e.g. \"0.bias\"; "
                         "Trainer::layout() lists them) and its tags (bias, norm, embedding)");
  return plan;
}
}  // namespace dtrain
DTRAIN_IMPL_END
