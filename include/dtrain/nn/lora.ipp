// The definitions lora.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <algorithm>

#include "dtrain/nn/lora.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn::detail {
  DTRAIN_DECL LoraSite::LoraSite(const std::string& what, std::string name, const LoraOptions& o, std::int64_t in,
                                 std::int64_t out, std::int64_t segments, bool memory)
      : name_(std::move(name)), options_(o), in_(in), out_(out), segments_(segments), memory_(memory) {
    const std::string where = what + (name_.empty() ? "" : " " + name_) + ": LoRA ";
    if (o.r < 0) throw config_error(where + "rank " + std::to_string(o.r) + " is negative", "give lora_r >= 1");
    if (!o.on()) return;
    if (segments < 1 || out % segments != 0)
      throw config_error(
          where + std::to_string(segments) + " segments do not divide " + std::to_string(out) + " outputs",
          "report this: the unit splits its projection wrongly");
    if (o.r > in || o.r > out / segments)
      throw config_error(where + "rank " + std::to_string(o.r) + " exceeds the layer's dimensions [" +
                             std::to_string(out / segments) + ", " + std::to_string(in) + "]",
                         "give lora_r <= " + std::to_string(std::min(in, out / segments)));
    if (!(o.alpha > 0.f) || !std::isfinite(o.alpha))
      throw config_error(where + "alpha " + std::to_string(o.alpha) + " must be positive and finite",
                         "give lora_alpha > 0 (PEFT's default is 8)");
    if (!(o.dropout >= 0.f && o.dropout < 1.f))
      throw config_error(where + "dropout " + std::to_string(o.dropout) + " is outside [0, 1)",
                         "give lora_dropout in [0, 1), e.g. 0.05 (PEFT's default is 0)");
  }

  DTRAIN_DECL std::vector<ParamSpec> LoraSite::params() const {
    if (!on()) return {};
    const std::string prefix = name_.empty() ? "" : name_ + ".";
    return {{prefix + "lora_A", {segments_ * options_.r, in_}, Init::fan_in_uniform(in_), true, {}, {"lora"}},
            {prefix + "lora_B", {out_, options_.r}, Init::zeros(), true, {}, {"lora"}}};
  }

  DTRAIN_DECL std::vector<ParamSpec> LoraSet::params() const {
    std::vector<ParamSpec> out;
    for (const auto& s : sites_)
      for (auto& p : s.params()) out.push_back(std::move(p));
    return out;
  }

}  // namespace dtrain::nn::detail

DTRAIN_IMPL_END
