// The definitions rotary_attention.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/nn/rotary_attention.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  namespace detail {
  DTRAIN_DECL GroupedAttentionBase::GroupedAttentionBase(const char* name, std::int64_t dim, std::int64_t heads,
                                                         GroupedAttentionOptions options, bool rotary, bool cross,
                                                         bool causal_mask)
      : name_(name),
        dim_(dim),
        heads_(heads),
        head_dim_(options.head_dim > 0 ? options.head_dim : (heads > 0 ? dim / heads : 0)),
        inner_(heads * head_dim_),
        kv_heads_(options.kv_heads == 0 ? heads : options.kv_heads),
        memory_dim_(cross && options.memory_dim > 0 ? options.memory_dim : dim),
        options_(options),
        rope_(rotary && options.rope_theta > 0.f) {
    const std::string what = std::string(name) + "(" + std::to_string(dim) + ", " + std::to_string(heads) + ")";
    if (dim < 1 || heads < 1 || options.head_dim < 0 || (options.head_dim == 0 && dim % heads != 0))
      throw config_error(what + ": the width must be a positive multiple of the head count (or head_dim given)",
                         "choose dim = heads x head_dim, e.g. 128 with 4 heads, or give .head_dim");
    if (kv_heads_ < 1 || heads % kv_heads_ != 0)
      throw config_error(what + ": kv_heads " + std::to_string(options.kv_heads) + " does not divide the heads",
                         "give num_key_value_heads dividing num_attention_heads (1 for multi-query)");
    if (rotary && (options.rope_theta < 0.f || (options.rope_theta > 0.f && head_dim() % 2 != 0)))
      throw config_error(what + ": rotary embedding needs an even head_dim and rope_theta >= 0",
                         "use an even head_dim, or rope_theta = 0 for no rotary embedding");
    if (options.window < 0 || (options.window > 0 && !causal_mask))
      throw config_error(
          what + ": window " + std::to_string(options.window) + " needs the Causal mask and a width >= 0",
          "give window > 0 on a causal attention, or 0 for none");
    if (!(options.scale >= 0.f) || !(options.rope_factor > 0.f))
      throw config_error(what + ": the scale must be >= 0 and the rope factor > 0",
                         "give scale 0 for 1 / sqrt(head_dim), and rope_factor 1 for unscaled positions");
    const std::int64_t kv = kv_heads_ * head_dim();
    lora_ = LoraSet(base_count(), {LoraSite(what, "q", options.q_lora, dim, inner_),
                                   LoraSite(what, "k", options.k_lora, memory_dim_, kv, 1, cross),
                                   LoraSite(what, "v", options.v_lora, memory_dim_, kv, 1, cross),
                                   LoraSite(what, "o", options.o_lora, inner_, dim)});
  }

  DTRAIN_DECL std::vector<ParamSpec> GroupedAttentionBase::params() const {
    const Init w = Init::normal(0.f, options_.init_std);
    const std::int64_t hd = head_dim(), kv = kv_heads_ * hd;
    // a projection with an adapter is frozen, its bias too
    const auto train = [&](std::size_t i) { return options_.trainable && !lora_.on(i); };
    std::vector<ParamSpec> p{{"q.weight", {inner_, dim_}, w, train(0)},
                             {"k.weight", {kv, memory_dim_}, w, train(1)},
                             {"v.weight", {kv, memory_dim_}, w, train(2)},
                             {"o.weight", {dim_, inner_}, w, train(3)}};
    if (options_.qkv_bias) {
      p.push_back({"q.bias", {inner_}, Init::zeros(), train(0), {}, {"bias"}});
      p.push_back({"k.bias", {kv}, Init::zeros(), train(1), {}, {"bias"}});
      p.push_back({"v.bias", {kv}, Init::zeros(), train(2), {}, {"bias"}});
    }
    if (options_.out_bias) p.push_back({"o.bias", {dim_}, Init::zeros(), train(3), {}, {"bias"}});
    if (options_.qk_norm) {
      const Init norm = options_.qk_norm_offset == 0.f ? Init::ones() : Init::zeros();
      p.push_back({"q_norm.weight", {hd}, norm, options_.trainable, {}, {"norm"}});
      p.push_back({"k_norm.weight", {hd}, norm, options_.trainable, {}, {"norm"}});
    }
    for (auto& a : lora_.params()) p.push_back(std::move(a));
    return p;
  }
  }  // namespace detail

}  // namespace dtrain::nn

DTRAIN_IMPL_END
