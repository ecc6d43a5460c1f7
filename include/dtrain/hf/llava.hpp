#pragma once
// LLaVA: transformers' LlavaForConditionalGeneration (model_type "llava"),
// a vision tower, a projector and a language model, read from its
// config.json (hf::LlavaConfig), built as one list of dtrain units
// (hf::Llava) and loaded from / saved to transformers checkpoints:
//
//   the tower        hf::VisionTower's units (CLIP or SigLIP): its patch
//                    embedding reads the batch's "pixel_values" [B, 3, H, W]
//                    float32, one image per sequence; the features
//                    [B * F, vision hidden] (vision_feature_layer, select strategy)
//   the projector    multi_modal_projector.linear_1 (vision hidden -> text
//                    hidden), the erf GELU, linear_2 (text hidden -> text hidden)
//   the merge        nn::ImageTokenMerge: the language model's token
//                    embedding over the batch's ids "x" [B, T], each image's
//                    F features written, in order, at its sequence's F image
//                    tokens (image_token_index), as the processor expands them
//                    (with a Gemma of transformers 4, the features times
//                    sqrt(hidden_size), as its model scales its whole input)
//   the language     hf::CausalLm's blocks, final norm and head (any family
//   model            hf::parse_config reads: Llama, Gemma, ...; a tied head
//                    ties to the merge's table)
//
// The loss is cross-entropy over "y" [B, T], the next token's id (-100
// ignored: shift transformers' labels by one). The batch's
// "attention_mask" and "position_ids", if any, are the text's: the
// language model reads them, the tower does not.
//
// Which parts train (LlavaTrain, parse_llava_train("projector,vision")):
// the others are frozen, with no gradient, master copy or optimizer state.
// LoRA adapters on the language model (hf::LoraConfig) train beside them;
// with adapters the language model's base weights are frozen and only its
// modules_to_save train whole.
//
// Key layouts: transformers 4 saves vision_tower.vision_model.<module>,
// multi_modal_projector.<module>, language_model.model.<module> and
// language_model.lm_head.weight; transformers 5 saves the same with the
// tower's modules straight under vision_tower. (its in-memory names,
// model.vision_tower., model.multi_modal_projector., model.language_model.
// and lm_head., are read too). save_pretrained writes the layout of the
// config's transformers_version.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dtrain/core/macros.hpp"
#include "dtrain/hf/checkpoint.hpp"
#include "dtrain/hf/config.hpp"
#include "dtrain/hf/lora.hpp"
#include "dtrain/hf/model.hpp"
#include "dtrain/hf/vision.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/embedding.hpp"
#include "dtrain/nn/image_merge.hpp"
#include "dtrain/nn/linear.hpp"

namespace dtrain::hf {

struct LlavaConfig {
  VisionConfig vision;               // the tower, with vision_feature_layer and vision_feature_select_strategy
  LmConfig text;                     // the language model (tie_word_embeddings as LLaVA resolves it)
  std::int64_t image_token = 32000;  // image_token_index (transformers 5: image_token_id)
  bool projector_bias = true;        // multimodal_projector_bias
  int transformers_major = 4;        // the key layout to write: transformers_version's major
  std::string json_text;             // the whole config (compact JSON), written back on save

  // Feature rows per image (the tower's tokens less the dropped one).
  DTRAIN_DECL std::int64_t features_per_image() const;
};

// Checks and reads a LLaVA config; `where` names it in errors. Refused by
// name: another model_type, a tower or language model dtrain does not
// build (the supported ones listed), projector_hidden_act other than
// "gelu", a list of vision_feature_layer, an image token outside the
// vocabulary.
DTRAIN_DECL LlavaConfig parse_llava_config(const nlohmann::ordered_json& j, const std::string& where);

// Reads and checks `path` (a config.json, or the directory holding one).
DTRAIN_DECL LlavaConfig read_llava_config(std::filesystem::path path);

// The parts that train; the others are frozen.
struct LlavaTrain {
  bool vision = false;
  bool projector = true;
  bool language = false;
};

// A comma list of parts: "vision", "projector", "language", or "all"
// (LLaVA's stages: "projector", then "projector,language" or "all"). A
// part the model lacks is a config_error naming it and the parts.
DTRAIN_DECL LlavaTrain parse_llava_train(std::string_view list);

struct Llava {
  LlavaConfig config;
  LlavaTrain train;
  LoraPlan lora;
  VisionTower tower;
  nn::Linear linear_1;
  nn::GELU act;
  nn::Linear linear_2;
  nn::ImageTokenMerge merge;
  std::vector<nn::PositionalEmbedding> positions;  // a GPT-2 language model's learned positions
  std::vector<Block> blocks;
  FinalNorm norm;
  nn::Linear head;
  nn::SoftmaxCrossEntropy loss;

  DTRAIN_DECL explicit Llava(LlavaConfig c, LlavaTrain parts = {}, const LoraConfig& adapters = {});

  auto units() {
    return std::tie(tower.embed, tower.pre_norm, tower.layers, tower.select, linear_1, act, linear_2, merge, positions,
                    blocks, norm, head);
  }

  // The unit numbers: the projector's first, the merge's.
  DTRAIN_DECL std::size_t projector_unit() const;
  std::size_t merge_unit() const { return projector_unit() + 3; }
};

// The transformers module each unit is, in unit order (for
// units_named and so checkpoint_modules): vision_tower.embeddings,
// vision_tower.pre_layrnorm (CLIP), vision_tower.encoder.layers.0 ...,
// vision_tower.feature_select (the class token dropped: "default"),
// multi_modal_projector.linear_1, .act, .linear_2,
// language_model.embed_tokens (the merge), language_model.layers.0 ...
// (GPT-2: language_model.wpe, language_model.h.0 ...), language_model.norm,
// lm_head. "encoder.layers.*" recomputes the tower's layers,
// "language_model.layers.*" the language model's blocks.
DTRAIN_DECL std::vector<std::string> unit_modules(const Llava& model);

// The units whose module one of `patterns` names (hf::units_named's rules).
DTRAIN_DECL std::vector<std::size_t> units_named(const Llava& model, const std::vector<std::string>& patterns);

// A checkpoint's key layout: where the tower's modules sit (under
// "vision_model." as transformers 4 saves them, or not), and whether the
// names are transformers 5's in-memory ones (model.language_model., lm_head.).
struct LlavaLayout {
  bool tower_prefixed = true;
  bool nested = false;
  // The layout save_pretrained writes for transformers `major`.
  static LlavaLayout written_by(int major) { return {major < 5, false}; }
};

// The layout of the checkpoint in `dir`, from its tensor names.
DTRAIN_DECL LlavaLayout llava_layout_of(const std::filesystem::path& dir);

// The model's tensors under transformers' names in `layout`.
DTRAIN_DECL TransformersNames llava_transformers_names(const Llava& model, LlavaLayout layout);

// Loads a LlavaForConditionalGeneration checkpoint (any layout above) into a
// trainer of hf::Llava: every tensor the model runs must be there with its
// shape; the tower's unrun tensors (and a tied head's copy) stay in the
// file; LoRA adapters keep their initial values. Collective.
template <class Trainer>
LoadParamsReport load_pretrained(Trainer& trainer, const std::filesystem::path& dir, const Llava& model) {
  ParamSources sources = open_checkpoint(dir, llava_transformers_names(model, llava_layout_of(dir)));
  std::set<std::string> used;
  for (const auto& [ours, parts] : sources.parts)
    for (const auto& part : parts) used.insert(part.second);
  for (const SafetensorsFile& f : sources.files)
    for (const std::string& n : f.names())
      if (!used.contains(n)) sources.ignored.insert(n);
  return trainer.load_params(sources, {.strict = true, .skip_tags = {"lora"}});
}

// The tensors of `source` (the checkpoint the model was loaded from) that
// the model does not hold (the tower's layers past its feature layer, its
// post_layernorm or head), renamed to `layout`; a tied head's copy is left
// out.
DTRAIN_DECL std::vector<PretrainedTensor> llava_tensors_not_in(const Llava& model, const std::filesystem::path& source,
                                                               LlavaLayout layout);

// Writes the trainer's model as save_pretrained does, in the key layout of
// the config's transformers version, LoRA adapters merged into their
// weights, the tensors it does not hold copied unchanged from `source` (""
// writes only the model's own). Collective.
template <class Trainer>
void save_pretrained(Trainer& trainer, const std::filesystem::path& dir, const Llava& model,
                     const std::filesystem::path& source, SavePretrainedOptions options = {}) {
  const LlavaLayout layout = LlavaLayout::written_by(model.config.transformers_major);
  std::vector<PretrainedTensor> extra;
  if (trainer.world().rank() == 0 && !source.empty()) extra = llava_tensors_not_in(model, source, layout);
  options.lora = model.lora.config;
  save_transformers(trainer, dir, llava_transformers_names(model, layout), model.config.json_text, options, extra);
}

}  // namespace dtrain::hf

#if DTRAIN_DEFINE_IMPL
#include "dtrain/hf/llava.ipp"
#endif
