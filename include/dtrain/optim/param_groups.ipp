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
}  // namespace dtrain
DTRAIN_IMPL_END
