// The definitions unet.hpp declares with DTRAIN_DECL: included at the end of
// the header when DTRAIN_DEFINE_IMPL (core/macros.hpp).
#pragma once

#include <fstream>
#include <map>
#include <set>

#include "dtrain/diffusion/schedule.hpp"
#include "dtrain/diffusion/unet.hpp"
#include "dtrain/io/json.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::diffusion {
  namespace detail {

  // The keys read into models::UNetConfig.
  inline const std::set<std::string>& unet_keys() {
    static const std::set<std::string> keys{
        "sample_size", "in_channels", "out_channels", "flip_sin_to_cos", "freq_shift", "down_block_types",
        "mid_block_type", "up_block_types", "block_out_channels", "layers_per_block", "mid_block_scale_factor",
        "norm_num_groups", "norm_eps", "cross_attention_dim", "transformer_layers_per_block", "attention_head_dim",
        "num_attention_heads", "use_linear_projection", "addition_embed_type", "addition_time_embed_dim",
        "projection_class_embeddings_input_dim",
        // no effect on what dtrain computes: its attention's softmax is
        // float32 in every precision (upcast), and the "text" embedding's
        // heads are unused by text_time
        "upcast_attention", "addition_embed_type_num_heads"};
    return keys;
  }

  // The keys that must hold diffusers' default (null where the default is
  // None): what they would change is not built.
  inline const std::map<std::string, nlohmann::ordered_json>& unet_fixed_keys() {
    static const std::map<std::string, nlohmann::ordered_json> keys{{"center_input_sample", false},
                                                                    {"only_cross_attention", false},
                                                                    {"downsample_padding", 1},
                                                                    {"dropout", 0.0},
                                                                    {"act_fn", "silu"},
                                                                    {"reverse_transformer_layers_per_block", nullptr},
                                                                    {"encoder_hid_dim", nullptr},
                                                                    {"encoder_hid_dim_type", nullptr},
                                                                    {"dual_cross_attention", false},
                                                                    {"class_embed_type", nullptr},
                                                                    {"num_class_embeds", nullptr},
                                                                    {"resnet_time_scale_shift", "default"},
                                                                    {"resnet_skip_time_act", false},
                                                                    {"resnet_out_scale_factor", 1.0},
                                                                    {"time_embedding_type", "positional"},
                                                                    {"time_embedding_dim", nullptr},
                                                                    {"time_embedding_act_fn", nullptr},
                                                                    {"timestep_post_act", nullptr},
                                                                    {"time_cond_proj_dim", nullptr},
                                                                    {"conv_in_kernel", 3},
                                                                    {"conv_out_kernel", 3},
                                                                    {"attention_type", "default"},
                                                                    {"class_embeddings_concat", false},
                                                                    {"mid_block_only_cross_attention", nullptr},
                                                                    {"cross_attention_norm", nullptr}};
    return keys;
  }

  // An int or a list of ints, as a list.
  inline std::vector<std::int64_t> int_list(const nlohmann::ordered_json& j, const std::string& where, const char* key,
                                            std::vector<std::int64_t> fallback) {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    const auto& v = j.at(key);
    if (v.is_number_integer()) return {v.get<std::int64_t>()};
    std::vector<std::int64_t> out;
    if (v.is_array())
      for (const auto& e : v) {
        if (!e.is_number_integer()) {
          out.clear();
          break;
        }
        out.push_back(e.get<std::int64_t>());
      }
    if (out.empty())
      throw config_error(where + ": \"" + key + "\" is " + v.dump() + ", not an integer or a list of integers",
                         "give one integer, or one per block (nested lists are not supported)");
    return out;
  }

  // A list of strings.
  inline std::vector<std::string> string_list(const nlohmann::ordered_json& j, const std::string& where,
                                              const char* key, std::vector<std::string> fallback) {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    const auto& v = j.at(key);
    std::vector<std::string> out;
    if (v.is_array())
      for (const auto& e : v) {
        if (!e.is_string())
          throw config_error(where + ": \"" + key + "\" is " + v.dump() + ", not a list of names",
                             "give the block types as a list of strings");
        out.push_back(e.get<std::string>());
      }
    if (out.empty())
      throw config_error(where + ": \"" + key + "\" is " + v.dump() + ", not a list of names",
                         "give the block types as a list of strings");
    return out;
  }

  }  // namespace detail

  DTRAIN_DECL std::filesystem::path unet_folder(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    if (fs::is_directory(path) && !fs::exists(path / "config.json") && fs::exists(path / "unet" / "config.json"))
      return path / "unet";
    return path;
  }

  DTRAIN_DECL models::UNetConfig read_unet_config(const std::filesystem::path& dir_or_file) {
    namespace fs = std::filesystem;
    const fs::path file = fs::is_directory(dir_or_file) ? unet_folder(dir_or_file) / "config.json" : dir_or_file;
    const std::string where = "\"" + file.string() + "\"";
    const std::string fix =
        "give a diffusers UNet folder (UNet2DConditionModel.save_pretrained writes one) or a "
        "pipeline folder holding unet/";
    std::ifstream in(file);
    if (!in) throw config_error(where + " cannot be read", fix);
    const auto j = dtrain::detail::parse_json(
        in, [&](const std::string& problem) { return config_error(where + " is " + problem, fix); });
    if (!j.is_object()) throw config_error(where + " is not a JSON object", fix);
    const std::string cls = detail::get<std::string>(j, where, "_class_name", "UNet2DConditionModel");
    if (cls != "UNet2DConditionModel")
      throw config_error(where + ": _class_name \"" + cls + "\" is not supported (supported: UNet2DConditionModel)",
                         "give the UNet of a Stable Diffusion 1.x/2.x or SDXL pipeline");
    for (const auto& [key, value] : j.items()) {
      if (key.starts_with("_") || detail::unet_keys().contains(key)) continue;
      const auto fixed = detail::unet_fixed_keys().find(key);
      if (fixed == detail::unet_fixed_keys().end())
        throw config_error(where + ": unknown key \"" + key + "\" for a UNet2DConditionModel",
                           "remove it, or use a config of the diffusers release dtrain reads (0.42)");
      const bool same = value == fixed->second || (value.is_number() && fixed->second.is_number() &&
                                                   value.get<double>() == fixed->second.get<double>());
      if (!same)
        throw config_error(
            where + ": \"" + key + "\" is " + value.dump() + "; dtrain builds only " + fixed->second.dump(),
            "use a UNet with " + key + " " + fixed->second.dump() + " (Stable Diffusion 1.x/2.x and SDXL have it)");
    }
    models::UNetConfig c;
    const auto sample = detail::int_list(j, where, "sample_size", {64});
    if (sample.size() > 2) throw config_error(where + ": sample_size " + j.at("sample_size").dump(), fix);
    c.sample_height = sample.front();
    c.sample_width = sample.back();
    c.in_channels = detail::get<std::int64_t>(j, where, "in_channels", c.in_channels);
    c.out_channels = detail::get<std::int64_t>(j, where, "out_channels", c.out_channels);
    c.flip_sin_to_cos = detail::get<bool>(j, where, "flip_sin_to_cos", c.flip_sin_to_cos);
    c.freq_shift = detail::get<double>(j, where, "freq_shift", c.freq_shift);
    c.down_block_types = detail::string_list(j, where, "down_block_types", c.down_block_types);
    c.up_block_types = detail::string_list(j, where, "up_block_types", c.up_block_types);
    if (j.contains("mid_block_type"))
      c.mid_block_type =
          j.at("mid_block_type").is_null() ? "" : detail::get<std::string>(j, where, "mid_block_type", "");
    c.block_out_channels = detail::int_list(j, where, "block_out_channels", c.block_out_channels);
    c.layers_per_block = detail::int_list(j, where, "layers_per_block", c.layers_per_block);
    c.mid_block_scale_factor = detail::get<float>(j, where, "mid_block_scale_factor", c.mid_block_scale_factor);
    c.norm_num_groups = detail::get<std::int64_t>(j, where, "norm_num_groups", c.norm_num_groups);
    c.norm_eps = detail::get<float>(j, where, "norm_eps", c.norm_eps);
    if (j.contains("cross_attention_dim") && j.at("cross_attention_dim").is_array())
      throw config_error(where + ": cross_attention_dim is a list; dtrain builds one text width for every block",
                         "give one integer");
    c.cross_attention_dim = detail::get<std::int64_t>(j, where, "cross_attention_dim", c.cross_attention_dim);
    c.transformer_layers_per_block =
        detail::int_list(j, where, "transformer_layers_per_block", c.transformer_layers_per_block);
    // diffusers: num_attention_heads = num_attention_heads or attention_head_dim
    c.attention_heads = detail::int_list(j, where, "num_attention_heads",
                                         detail::int_list(j, where, "attention_head_dim", c.attention_heads));
    c.use_linear_projection = detail::get<bool>(j, where, "use_linear_projection", c.use_linear_projection);
    c.addition_embed_type = detail::get<std::string>(j, where, "addition_embed_type", "");
    c.addition_time_embed_dim =
        detail::get<std::int64_t>(j, where, "addition_time_embed_dim", c.addition_time_embed_dim);
    c.projection_class_embeddings_input_dim = detail::get<std::int64_t>(
        j, where, "projection_class_embeddings_input_dim", c.projection_class_embeddings_input_dim);
    try {
      models::check_unet_config(c);
    } catch (const config_error& e) {
      throw config_error(where + ": " + e.problem(), e.fix());
    }
    return c;
  }

  DTRAIN_DECL std::string unet_config_json(const models::UNetConfig& c, const std::string& base) {
    nlohmann::ordered_json j = base.empty() ? nlohmann::ordered_json::object() : nlohmann::ordered_json::parse(base);
    if (!j.contains("_class_name")) j["_class_name"] = "UNet2DConditionModel";
    j["sample_size"] = c.sample_height == c.sample_width
                           ? nlohmann::ordered_json(c.sample_height)
                           : nlohmann::ordered_json::array({c.sample_height, c.sample_width});
    j["in_channels"] = c.in_channels;
    j["out_channels"] = c.out_channels;
    j["flip_sin_to_cos"] = c.flip_sin_to_cos;
    j["freq_shift"] = c.freq_shift;
    j["down_block_types"] = c.down_block_types;
    j["mid_block_type"] =
        c.mid_block_type.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(c.mid_block_type);
    j["up_block_types"] = c.up_block_types;
    j["block_out_channels"] = c.block_out_channels;
    const auto one_or_list = [](const std::vector<std::int64_t>& v) {
      return v.size() == 1 ? nlohmann::ordered_json(v[0]) : nlohmann::ordered_json(v);
    };
    j["layers_per_block"] = one_or_list(c.layers_per_block);
    j["mid_block_scale_factor"] = c.mid_block_scale_factor;
    j["norm_num_groups"] = c.norm_num_groups;
    j["norm_eps"] = c.norm_eps;
    j["cross_attention_dim"] = c.cross_attention_dim;
    j["transformer_layers_per_block"] = one_or_list(c.transformer_layers_per_block);
    // The heads where the base has them: diffusers 0.42 refuses num_attention_heads for this model and reads
    // the head count from attention_head_dim (its historical naming) when num_attention_heads is null.
    if (j.contains("num_attention_heads") && !j.at("num_attention_heads").is_null()) {
      j["num_attention_heads"] = one_or_list(c.attention_heads);
    } else {
      j["num_attention_heads"] = nullptr;
      j["attention_head_dim"] = one_or_list(c.attention_heads);
    }
    j["use_linear_projection"] = c.use_linear_projection;
    if (c.addition_embed_type.empty()) {
      j["addition_embed_type"] = nullptr;
    } else {
      j["addition_embed_type"] = c.addition_embed_type;
      j["addition_time_embed_dim"] = c.addition_time_embed_dim;
      j["projection_class_embeddings_input_dim"] = c.projection_class_embeddings_input_dim;
    }
    return j.dump(2);
  }

}  // namespace dtrain::diffusion

DTRAIN_IMPL_END
