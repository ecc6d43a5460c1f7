// The definitions linear.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/nn/linear.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  DTRAIN_DECL Linear::Linear(std::int64_t in_features, std::int64_t out_features, LinearOptions options)
      : in_(in_features), out_(out_features), options_(options) {
    if (in_features < 1 || out_features < 1)
      throw config_error("nn::Linear(" + std::to_string(in_features) + ", " + std::to_string(out_features) +
                             "): feature counts must be >= 1",
                         "give positive input and output widths");
    lora_ = detail::LoraSet(base_params(),
                            {detail::LoraSite("nn::Linear", "", options.lora, in_, out_, options.lora_segments)});
    if (options.lora.on() && !options.tie_weight.empty())
      throw config_error("nn::Linear: a LoRA adapter on a weight tied to '" + options.tie_weight + "'",
                         "adapt an untied projection");
  }

  DTRAIN_DECL std::vector<ParamSpec> Linear::params() const {
    const bool train = options_.trainable && !lora_.any();
    std::vector<ParamSpec> specs{{"weight", {out_, in_}, Init::fan_in_uniform(in_), train, options_.tie_weight}};
    if (options_.bias) specs.push_back({"bias", {out_}, Init::fan_in_uniform(in_), train, {}, {"bias"}});
    for (auto& p : lora_.params()) specs.push_back(std::move(p));
    return specs;
  }

  DTRAIN_DECL void Linear::no_lora_here() const {
    if (lora_.any())
      throw config_error("nn::Linear: a LoRA adapter needs the call with a UnitContext (its saved view)",
                         "call forward/backward with the context (saved_size(shape, in) elements)");
  }

}  // namespace dtrain::nn

DTRAIN_IMPL_END
