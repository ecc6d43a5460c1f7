// The definitions act.hpp declares with DTRAIN_DECL: included at the end of
// the header when DTRAIN_DEFINE_IMPL (core/macros.hpp).
#pragma once

#include <cmath>
#include <fstream>
#include <set>

#include "dtrain/io/json.hpp"
#include "dtrain/lerobot/act.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::lerobot {
  namespace detail {

  // The keys of LeRobot 0.4's PreTrainedConfig and ACTConfig: the ones dtrain
  // reads and the ones it keeps as they are (device, hub and optimizer-free
  // settings that do not shape the model).
  inline const std::set<std::string>& act_keys() {
    static const std::set<std::string> keys = {"type",
                                               "n_obs_steps",
                                               "normalization_mapping",
                                               "input_features",
                                               "output_features",
                                               "device",
                                               "use_amp",
                                               "use_peft",
                                               "push_to_hub",
                                               "repo_id",
                                               "private",
                                               "tags",
                                               "license",
                                               "pretrained_path",
                                               "chunk_size",
                                               "n_action_steps",
                                               "vision_backbone",
                                               "pretrained_backbone_weights",
                                               "replace_final_stride_with_dilation",
                                               "pre_norm",
                                               "dim_model",
                                               "n_heads",
                                               "dim_feedforward",
                                               "feedforward_activation",
                                               "n_encoder_layers",
                                               "n_decoder_layers",
                                               "use_vae",
                                               "latent_dim",
                                               "n_vae_encoder_layers",
                                               "temporal_ensemble_coeff",
                                               "dropout",
                                               "kl_weight",
                                               "optimizer_lr",
                                               "optimizer_weight_decay",
                                               "optimizer_lr_backbone"};
    return keys;
  }

  template <class V>
  V get(const nlohmann::ordered_json& j, const std::string& where, const char* key, V fallback) {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    try {
      return j.at(key).get<V>();
    } catch (const nlohmann::json::exception&) {
      throw config_error(where + ": \"" + key + "\" is " + j.at(key).dump() + ", not a value of the right type",
                         "write a LeRobot ACT config.json (ACTPolicy.save_pretrained writes one)");
    }
  }

  inline std::vector<std::int64_t> feature_shape(const nlohmann::ordered_json& f, const std::string& where,
                                                 const std::string& name) {
    if (!f.is_object() || !f.contains("shape") || !f.at("shape").is_array())
      throw config_error(where + ": feature \"" + name + "\" has no shape",
                         "give each feature as {\"type\": ..., \"shape\": [...]}, as LeRobot writes it");
    std::vector<std::int64_t> shape;
    for (const auto& d : f.at("shape")) {
      if (!d.is_number_integer() || d.get<std::int64_t>() <= 0)
        throw config_error(where + ": feature \"" + name + "\" has shape " + f.at("shape").dump(),
                           "give positive integer sizes");
      shape.push_back(d.get<std::int64_t>());
    }
    return shape;
  }

  inline std::string feature_type(const nlohmann::ordered_json& f) {
    return f.is_object() && f.contains("type") && f.at("type").is_string() ? f.at("type").get<std::string>() : "";
  }

  }  // namespace detail

  DTRAIN_DECL models::ActConfig read_act_config(const std::filesystem::path& dir_or_file) {
    namespace fs = std::filesystem;
    const fs::path file = fs::is_directory(dir_or_file) ? dir_or_file / "config.json" : dir_or_file;
    const std::string where = "\"" + file.string() + "\"";
    std::ifstream in(file);
    if (!in)
      throw config_error(where + " cannot be read",
                         "give a LeRobot policy directory holding config.json (ACTPolicy.save_pretrained writes one)");
    const auto j = dtrain::detail::parse_json(in, [&](const std::string& problem) {
      return config_error(where + " is " + problem, "re-save the policy with save_pretrained");
    });
    if (!j.is_object()) throw config_error(where + " is not a JSON object", "re-save the policy with save_pretrained");
    const std::string type = detail::get<std::string>(j, where, "type", "");
    if (type != "act")
      throw config_error(
          where + ": policy type \"" + type + "\" is not supported (supported: " + supported_policies + ")",
          "give a LeRobot ACT policy (config.json \"type\": \"act\")");
    for (const auto& [key, value] : j.items())
      if (!detail::act_keys().contains(key))
        throw config_error(where + ": unknown key \"" + key + "\" for an ACT policy",
                           "remove it, or use the LeRobot release dtrain reads (0.4.x), whose ACTConfig lacks it");
    models::ActConfig c;
    c.chunk_size = detail::get<std::int64_t>(j, where, "chunk_size", c.chunk_size);
    c.n_action_steps = detail::get<std::int64_t>(j, where, "n_action_steps", c.n_action_steps);
    c.vision_backbone = detail::get<std::string>(j, where, "vision_backbone", c.vision_backbone);
    c.replace_final_stride_with_dilation =
        detail::get<bool>(j, where, "replace_final_stride_with_dilation", c.replace_final_stride_with_dilation);
    c.pre_norm = detail::get<bool>(j, where, "pre_norm", c.pre_norm);
    c.dim_model = detail::get<std::int64_t>(j, where, "dim_model", c.dim_model);
    c.n_heads = detail::get<std::int64_t>(j, where, "n_heads", c.n_heads);
    c.dim_feedforward = detail::get<std::int64_t>(j, where, "dim_feedforward", c.dim_feedforward);
    c.feedforward_activation = detail::get<std::string>(j, where, "feedforward_activation", c.feedforward_activation);
    c.n_encoder_layers = detail::get<std::int64_t>(j, where, "n_encoder_layers", c.n_encoder_layers);
    c.n_decoder_layers = detail::get<std::int64_t>(j, where, "n_decoder_layers", c.n_decoder_layers);
    c.use_vae = detail::get<bool>(j, where, "use_vae", c.use_vae);
    c.latent_dim = detail::get<std::int64_t>(j, where, "latent_dim", c.latent_dim);
    c.n_vae_encoder_layers = detail::get<std::int64_t>(j, where, "n_vae_encoder_layers", c.n_vae_encoder_layers);
    c.dropout = detail::get<float>(j, where, "dropout", c.dropout);
    c.kl_weight = detail::get<float>(j, where, "kl_weight", c.kl_weight);
    c.optimizer_lr = detail::get<float>(j, where, "optimizer_lr", c.optimizer_lr);
    c.optimizer_weight_decay = detail::get<float>(j, where, "optimizer_weight_decay", c.optimizer_weight_decay);
    c.optimizer_lr_backbone = detail::get<float>(j, where, "optimizer_lr_backbone", c.optimizer_lr_backbone);
    if (detail::get<std::int64_t>(j, where, "n_obs_steps", 1) != 1)
      throw config_error(where + ": n_obs_steps is not 1", "ACT takes one observation step (LeRobot's rule too)");
    if (j.contains("temporal_ensemble_coeff") && !j.at("temporal_ensemble_coeff").is_null())
      throw config_error(where + ": temporal_ensemble_coeff is set",
                         "set it to null: temporal ensembling is an inference-time option dtrain does not run");
    // features
    c.cameras.clear();
    bool sized = false;
    if (j.contains("input_features") && j.at("input_features").is_object())
      for (const auto& [name, f] : j.at("input_features").items()) {
        const std::string kind = detail::feature_type(f);
        const auto shape = detail::feature_shape(f, where, name);
        if (kind == "VISUAL") {
          if (shape.size() != 3)
            throw config_error(where + ": camera \"" + name + "\" has shape " + f.at("shape").dump(),
                               "give camera features as [channels, height, width]");
          if (sized && (shape[0] != c.image_channels || shape[1] != c.image_height || shape[2] != c.image_width))
            throw config_error(where + ": camera \"" + name + "\" differs in size from \"" + c.cameras.front() + "\"",
                               "give every camera the same size (as LeRobot's ACT requires)");
          c.image_channels = shape[0];
          c.image_height = shape[1];
          c.image_width = shape[2];
          sized = true;
          c.cameras.push_back(name);
        } else if (kind == "STATE") {
          if (name != "observation.state" || shape.size() != 1)
            throw config_error(where + ": state feature \"" + name + "\" " + f.at("shape").dump(),
                               "give the robot state as \"observation.state\" of shape [state_dim]");
          c.state_dim = shape[0];
        } else if (kind == "ENV") {
          throw config_error(where + ": input feature \"" + name + "\" (ENV, an environment state) is not supported",
                             "train ACT on camera images and the robot state");
        } else {
          throw config_error(where + ": input feature \"" + name + "\" has type \"" + kind + "\"",
                             "give VISUAL cameras and a STATE observation.state");
        }
      }
    if (j.contains("output_features") && j.at("output_features").is_object())
      for (const auto& [name, f] : j.at("output_features").items()) {
        const auto shape = detail::feature_shape(f, where, name);
        if (name != "action" || detail::feature_type(f) != "ACTION" || shape.size() != 1)
          throw config_error(where + ": output feature \"" + name + "\" " + f.dump(),
                             "give one output feature \"action\" of type ACTION and shape [action_dim]");
        c.action_dim = shape[0];
      }
    try {
      models::check_act_config(c);
    } catch (const config_error& e) {
      throw config_error(where + ": " + e.problem(), e.fix());
    }
    return c;
  }

  DTRAIN_DECL std::string act_config_json(const models::ActConfig& c, const std::string& base) {
    nlohmann::ordered_json j = base.empty() ? nlohmann::ordered_json::object() : nlohmann::ordered_json::parse(base);
    const auto put = [&](const char* key, auto value) { j[key] = value; };
    put("type", "act");
    if (!j.contains("n_obs_steps")) put("n_obs_steps", 1);
    if (!j.contains("normalization_mapping"))
      j["normalization_mapping"] = {{"VISUAL", "MEAN_STD"}, {"STATE", "MEAN_STD"}, {"ACTION", "MEAN_STD"}};
    nlohmann::ordered_json inputs = nlohmann::ordered_json::object();
    if (c.state_dim > 0) inputs["observation.state"] = {{"type", "STATE"}, {"shape", {c.state_dim}}};
    for (const auto& cam : c.cameras)
      inputs[cam] = {{"type", "VISUAL"}, {"shape", {c.image_channels, c.image_height, c.image_width}}};
    j["input_features"] = inputs;
    j["output_features"] = {{"action", {{"type", "ACTION"}, {"shape", {c.action_dim}}}}};
    if (!j.contains("device")) put("device", "cpu");
    if (!j.contains("use_amp")) put("use_amp", false);
    if (!j.contains("push_to_hub")) put("push_to_hub", false);
    if (!j.contains("repo_id")) j["repo_id"] = nullptr;
    if (!j.contains("private")) j["private"] = nullptr;
    if (!j.contains("tags")) j["tags"] = nullptr;
    if (!j.contains("license")) j["license"] = nullptr;
    put("chunk_size", c.chunk_size);
    put("n_action_steps", c.n_action_steps);
    put("vision_backbone", c.vision_backbone);
    if (!j.contains("pretrained_backbone_weights")) j["pretrained_backbone_weights"] = nullptr;
    put("replace_final_stride_with_dilation", c.replace_final_stride_with_dilation);
    put("pre_norm", c.pre_norm);
    put("dim_model", c.dim_model);
    put("n_heads", c.n_heads);
    put("dim_feedforward", c.dim_feedforward);
    put("feedforward_activation", c.feedforward_activation);
    put("n_encoder_layers", c.n_encoder_layers);
    put("n_decoder_layers", c.n_decoder_layers);
    put("use_vae", c.use_vae);
    put("latent_dim", c.latent_dim);
    put("n_vae_encoder_layers", c.n_vae_encoder_layers);
    j["temporal_ensemble_coeff"] = nullptr;
    put("dropout", c.dropout);
    put("kl_weight", c.kl_weight);
    put("optimizer_lr", c.optimizer_lr);
    put("optimizer_weight_decay", c.optimizer_weight_decay);
    put("optimizer_lr_backbone", c.optimizer_lr_backbone);
    return j.dump(4);
  }

  DTRAIN_DECL std::vector<float> vae_position_table(const models::ActConfig& c) {
    const std::int64_t tokens = 1 + (c.state_dim > 0 ? 1 : 0) + c.chunk_size, dim = c.dim_model;
    std::vector<float> out(static_cast<std::size_t>(tokens * dim));
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t k = 0; k < dim; ++k) {
        const double angle =
            static_cast<double>(t) / std::pow(10000.0, 2.0 * static_cast<double>(k / 2) / static_cast<double>(dim));
        out[static_cast<std::size_t>(t * dim + k)] = static_cast<float>(k % 2 == 0 ? std::sin(angle) : std::cos(angle));
      }
    return out;
  }

}  // namespace dtrain::lerobot

DTRAIN_IMPL_END
