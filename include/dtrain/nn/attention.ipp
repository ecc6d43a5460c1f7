// The definitions attention.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/nn/attention.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  DTRAIN_DECL CausalSelfAttention::AttentionUnit(std::int64_t dim, std::int64_t heads, AttentionOptions options)
      : dim_(dim), heads_(heads), options_(options) {
    if (dim < 1 || heads < 1 || dim % heads != 0)
      throw config_error("nn::CausalSelfAttention(" + std::to_string(dim) + ", " + std::to_string(heads) +
                             "): the width must be a positive multiple of the head count",
                         "choose dim = heads x head_dim, e.g. 128 with 4 heads");
    lora_ = detail::LoraSet(4, {detail::LoraSite("nn::CausalSelfAttention", "qkv", options.qkv_lora, dim, 3 * dim),
                                detail::LoraSite("nn::CausalSelfAttention", "proj", options.proj_lora, dim, dim)});
  }

  DTRAIN_DECL std::vector<ParamSpec> CausalSelfAttention::params() const {
    const Init w = Init::normal(0.f, options_.init_std);
    const bool qkv = options_.trainable && !lora_.on(0), proj = options_.trainable && !lora_.on(1);
    std::vector<ParamSpec> p{{"qkv.weight", {3 * dim_, dim_}, w, qkv},
                             {"qkv.bias", {3 * dim_}, Init::zeros(), qkv, {}, {"bias"}},
                             {"proj.weight", {dim_, dim_}, w, proj},
                             {"proj.bias", {dim_}, Init::zeros(), proj, {}, {"bias"}}};
    for (auto& a : lora_.params()) p.push_back(std::move(a));
    return p;
  }

}  // namespace dtrain::nn

DTRAIN_IMPL_END
