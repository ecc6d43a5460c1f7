#pragma once
// A tiny LLaVA for train_vlm's tests, written without Python: a config.json
// (a CLIP tower of 16 px images, patch 8, 2 layers, 32 wide, features at
// layer -2 without the class token: 4 per image; a Llama of 2 layers, 32
// wide, vocabulary 64, image token 63) and records of one image each, as
// the processor would make them:
//
//   ids     1 (bos), 63 x 4 (the image), 5 (the prompt), 10 + k, 20 + k, 2 (eos), 0 (padding)
//   labels  -100 over bos, image and prompt, the answer and eos, -100 over the padding
//   mask    1, except the padding
//
// k (0..3) is the image's class: its pixels are noise around a level of k's
// own, so only a model that looks at the image can predict the answer.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/io/safetensors.hpp>

namespace dtrain::test {

constexpr std::int64_t tiny_llava_image_token = 63, tiny_llava_vocab = 64, tiny_llava_features = 4,
                       tiny_llava_tokens = 10;

inline nlohmann::ordered_json tiny_llava_config() {
  return {{"model_type", "llava"},
          {"image_token_index", tiny_llava_image_token},
          {"vision_feature_layer", -2},
          {"vision_feature_select_strategy", "default"},
          {"projector_hidden_act", "gelu"},
          {"vision_config",
           {{"model_type", "clip_vision_model"},
            {"hidden_size", 32},
            {"intermediate_size", 64},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 2},
            {"num_channels", 3},
            {"image_size", 16},
            {"patch_size", 8}}},
          {"text_config",
           {{"model_type", "llama"},
            {"vocab_size", tiny_llava_vocab},
            {"hidden_size", 32},
            {"intermediate_size", 64},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"max_position_embeddings", 32},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false}}}};
}

inline void write_json(const std::filesystem::path& file, const nlohmann::ordered_json& j) {
  std::ofstream(file) << j.dump(2);
}

// The records' tensors, to be written as they are or spoiled first.
struct TinyLlavaData {
  std::int64_t n = 0, channels = 3, size = 16;
  std::vector<float> pixels;
  std::vector<std::int64_t> ids, labels, mask;

  static TinyLlavaData make(std::int64_t n, std::uint32_t seed = 1) {
    TinyLlavaData d;
    d.n = n;
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.f, 0.3f);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t k = i % 4;
      for (std::int64_t c = 0; c < d.channels; ++c)
        for (std::int64_t p = 0; p < d.size * d.size; ++p)
          d.pixels.push_back(noise(rng) + (c == k % 3 ? 1.f : -0.5f) * (k == 3 ? -1.f : 1.f));
      const std::int64_t t = tiny_llava_image_token;
      const std::vector<std::int64_t> ids{1, t, t, t, t, 5, 10 + k, 20 + k, 2, 0};
      const std::vector<std::int64_t> labels{-100, -100, -100, -100, -100, -100, 10 + k, 20 + k, 2, -100};
      d.ids.insert(d.ids.end(), ids.begin(), ids.end());
      d.labels.insert(d.labels.end(), labels.begin(), labels.end());
      for (std::int64_t p = 0; p < tiny_llava_tokens; ++p) d.mask.push_back(p + 1 < tiny_llava_tokens ? 1 : 0);
    }
    return d;
  }

  void write(const std::filesystem::path& file) const {
    SafetensorsWriter w;
    w.add("pixel_values", {n, channels, size, size}, pixels);
    w.add("input_ids", {n, tiny_llava_tokens}, ids);
    w.add("labels", {n, tiny_llava_tokens}, labels);
    w.add("attention_mask", {n, tiny_llava_tokens}, mask);
    w.write(file);
  }
};

}  // namespace dtrain::test
