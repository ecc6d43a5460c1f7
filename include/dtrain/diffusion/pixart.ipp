// The definitions pixart.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp).
#pragma once

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "dtrain/diffusion/pixart.hpp"
#include "dtrain/diffusion/schedule.hpp"
#include "dtrain/io/json.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::diffusion {
  namespace detail {

  // The keys read into models::PixArtConfig.
  inline const std::set<std::string>& pixart_keys() {
    static const std::set<std::string> keys{
        "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "num_layers", "cross_attention_dim",
        "caption_channels", "patch_size", "sample_size", "interpolation_scale", "norm_eps", "use_additional_conditions",
        // no effect on what dtrain computes: its attention's softmax is float32 in every precision (upcast),
        // ada_norm_single embeds the timesteps whatever num_embeds_ada_norm (checked non-null below, as
        // diffusers requires), and PixArt has no group norm
        "upcast_attention", "num_embeds_ada_norm", "norm_num_groups"};
    return keys;
  }

  // The keys that must hold diffusers' default (null where the default is
  // None): what they would change is not built. The last four are
  // Transformer2DModel's, which older PixArt configs carry and diffusers
  // ignores for this class.
  inline const std::map<std::string, nlohmann::ordered_json>& pixart_fixed_keys() {
    static const std::map<std::string, nlohmann::ordered_json> keys{{"dropout", 0.0},
                                                                    {"attention_bias", true},
                                                                    {"activation_fn", "gelu-approximate"},
                                                                    {"norm_type", "ada_norm_single"},
                                                                    {"norm_elementwise_affine", false},
                                                                    {"attention_type", "default"},
                                                                    {"use_linear_projection", false},
                                                                    {"num_vector_embeds", nullptr},
                                                                    {"only_cross_attention", false},
                                                                    {"double_self_attention", false}};
    return keys;
  }

  }  // namespace detail

  DTRAIN_DECL std::filesystem::path pixart_folder(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    if (fs::is_directory(path) && !fs::exists(path / "config.json") && fs::exists(path / "transformer" / "config.json"))
      return path / "transformer";
    return path;
  }

  DTRAIN_DECL models::PixArtConfig read_pixart_config(const std::filesystem::path& dir_or_file) {
    namespace fs = std::filesystem;
    const fs::path file = fs::is_directory(dir_or_file) ? pixart_folder(dir_or_file) / "config.json" : dir_or_file;
    const std::string where = "\"" + file.string() + "\"";
    const std::string fix =
        "give a diffusers PixArt transformer folder (PixArtTransformer2DModel.save_pretrained writes one) or a "
        "pipeline folder holding transformer/";
    std::ifstream in(file);
    if (!in) throw config_error(where + " cannot be read", fix);
    const auto j = dtrain::detail::parse_json(
        in, [&](const std::string& problem) { return config_error(where + " is " + problem, fix); });
    if (!j.is_object()) throw config_error(where + " is not a JSON object", fix);
    const std::string cls = detail::get<std::string>(j, where, "_class_name", "PixArtTransformer2DModel");
    if (cls != "PixArtTransformer2DModel")
      throw config_error(
          where + ": _class_name \"" + cls + "\" is not supported (supported: PixArtTransformer2DModel)",
          "give the transformer of a PixArt-alpha or PixArt-Sigma pipeline (diffusers' UNets: read_unet_config)");
    for (const auto& [key, value] : j.items()) {
      if (key.starts_with("_") || detail::pixart_keys().contains(key)) continue;
      const auto fixed = detail::pixart_fixed_keys().find(key);
      if (fixed == detail::pixart_fixed_keys().end())
        throw config_error(where + ": unknown key \"" + key + "\" for a PixArtTransformer2DModel",
                           "remove it, or use a config of the diffusers release dtrain reads (0.42)");
      const bool same = value == fixed->second || (value.is_number() && fixed->second.is_number() &&
                                                   value.get<double>() == fixed->second.get<double>());
      if (!same)
        throw config_error(
            where + ": \"" + key + "\" is " + value.dump() + "; dtrain builds only " + fixed->second.dump(),
            "use a PixArt with " + key + " " + fixed->second.dump() + " (PixArt-alpha and Sigma have it)");
    }
    if (j.contains("num_embeds_ada_norm") && j.at("num_embeds_ada_norm").is_null())
      throw config_error(where + ": num_embeds_ada_norm is null, which diffusers refuses for ada_norm_single",
                         "give an integer (PixArt: 1000)");
    const auto required = [&](const char* key, const std::string& what) {
      if (j.contains(key) && j.at(key).is_null())
        throw config_error(
            where + ": " + key + " is null (" + what + "), which dtrain does not build",
            "use a PixArt config with an integer " + std::string(key) + " (PixArt-alpha and Sigma have one)");
    };
    required("caption_channels", "no caption projection");
    required("cross_attention_dim", "no cross-attention");
    models::PixArtConfig c;
    c.num_attention_heads = detail::get<std::int64_t>(j, where, "num_attention_heads", c.num_attention_heads);
    c.attention_head_dim = detail::get<std::int64_t>(j, where, "attention_head_dim", c.attention_head_dim);
    c.in_channels = detail::get<std::int64_t>(j, where, "in_channels", c.in_channels);
    // diffusers: out_channels null means in_channels
    c.out_channels = j.contains("out_channels") && j.at("out_channels").is_null()
                         ? c.in_channels
                         : detail::get<std::int64_t>(j, where, "out_channels", c.out_channels);
    c.num_layers = detail::get<std::int64_t>(j, where, "num_layers", c.num_layers);
    c.cross_attention_dim = detail::get<std::int64_t>(j, where, "cross_attention_dim", c.cross_attention_dim);
    // (diffusers' default is None: no caption projection, refused above when written out)
    if (!j.contains("caption_channels"))
      throw config_error(where +
                             ": no caption_channels (diffusers' default None: no caption projection), which "
                             "dtrain does not build",
                         "use a PixArt config with caption_channels (PixArt: 4096)");
    c.caption_channels = detail::get<std::int64_t>(j, where, "caption_channels", c.caption_channels);
    c.patch_size = detail::get<std::int64_t>(j, where, "patch_size", c.patch_size);
    if (j.contains("sample_size") && !j.at("sample_size").is_null() && !j.at("sample_size").is_number_integer())
      throw config_error(where + ": sample_size " + j.at("sample_size").dump() + " is not an integer",
                         "give the latents' side as one integer (PixArt 1024: 128)");
    c.sample_size = detail::get<std::int64_t>(j, where, "sample_size", c.sample_size);
    c.sample_height = c.sample_width = c.sample_size;
    c.interpolation_scale = detail::get<double>(j, where, "interpolation_scale", 0.0);
    if (j.contains("interpolation_scale") && !j.at("interpolation_scale").is_null() && !(c.interpolation_scale > 0.0))
      throw config_error(where + ": interpolation_scale " + j.at("interpolation_scale").dump(),
                         "give a positive interpolation_scale, or null for diffusers' default");
    c.norm_eps = detail::get<float>(j, where, "norm_eps", c.norm_eps);
    // diffusers: null means true for sample_size 128 (PixArt-alpha 1024's resolution conditioning)
    c.use_additional_conditions = detail::get<bool>(j, where, "use_additional_conditions", c.sample_size == 128);
    try {
      models::check_pixart_config(c);
    } catch (const config_error& e) {
      throw config_error(where + ": " + e.problem(), e.fix());
    }
    return c;
  }

  DTRAIN_DECL std::string pixart_config_json(const models::PixArtConfig& c, const std::string& base) {
    nlohmann::ordered_json j = base.empty() ? nlohmann::ordered_json::object() : nlohmann::ordered_json::parse(base);
    if (!j.contains("_class_name")) j["_class_name"] = "PixArtTransformer2DModel";
    j["num_attention_heads"] = c.num_attention_heads;
    j["attention_head_dim"] = c.attention_head_dim;
    j["in_channels"] = c.in_channels;
    j["out_channels"] = c.out_channels;
    j["num_layers"] = c.num_layers;
    j["cross_attention_dim"] = c.cross_attention_dim;
    j["caption_channels"] = c.caption_channels;
    j["patch_size"] = c.patch_size;
    j["sample_size"] = c.sample_size;
    if (c.interpolation_scale > 0.0) {
      const double whole = std::round(c.interpolation_scale);
      j["interpolation_scale"] = whole == c.interpolation_scale
                                     ? nlohmann::ordered_json(static_cast<std::int64_t>(whole))
                                     : nlohmann::ordered_json(c.interpolation_scale);
    } else {
      j["interpolation_scale"] = nullptr;
    }
    j["norm_eps"] = c.norm_eps;
    j["use_additional_conditions"] = c.use_additional_conditions;
    return j.dump(2);
  }

}  // namespace dtrain::diffusion

DTRAIN_IMPL_END
