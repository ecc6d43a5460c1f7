#pragma once
// The train_vlm example: a transformers LLaVA model (hf::Llava: a CLIP or
// SigLIP tower, a projector, a language model) fine-tuned from its
// checkpoint (model=DIR) or trained from its config (config=FILE), the parts
// train= names training, the others frozen; optionally written back as a
// transformers directory (save_hf=DIR).
//
//   units: as hf::Llava
//   batch: pixel_values float32 [B, C, H, W], x int32 [B, T] the ids (each
//          image's tokens expanded), y int32 [B, T] the next ids (-100: no
//          loss), attention_mask int64 [B, T] when the data has one
//   data:  a safetensors file of N records, one image each: pixel_values
//          float32 [N, C, H, W] (normalised as the processor does),
//          input_ids [N, T] and labels [N, T] (int32 or int64, aligned as
//          transformers' labels are: -100 where no loss), optionally
//          attention_mask [N, T]

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/config.hpp"
#include "common/dispatch.hpp"

#include <dtrain/hf/llava.hpp>
#include <dtrain/io/safetensors.hpp>
#include <dtrain/models/llava.hpp>

namespace vlm {

// The model's keys (dtrain/models/llava.hpp, which dtrain-estimate reads
// too) and the run's own.
struct Config : dtrain::models::LlavaRunConfig {
  std::string data;                             // the records (a safetensors file)
  std::string save_hf;                          // write the trained model here as a transformers directory
  std::int64_t eval_batches = 8;                // held-out batches per rank evaluated at the end
  std::vector<std::string> checkpoint_modules;  // recompute the units of these modules (hf::units_named)
};

// The records, as the batches want them: x the ids, y the labels shifted by
// one (the last position predicts nothing).
struct Records {
  std::int64_t n = 0, tokens = 0;   // records, positions per record
  std::vector<std::int64_t> image;  // [C, H, W]
  std::vector<float> pixels;        // [N, C, H, W]
  std::vector<std::int32_t> x, y;   // [N, T]
  std::vector<std::int64_t> mask;   // [N, T], or empty
  std::int64_t split = 0;           // records before it train, after it evaluate: the last tenth
};

// One side of the split, as a data set.
class Samples {
 public:
  Samples(const Records& r, bool train) : r_(r), first_(train ? 0 : r.split), count_(train ? r.split : r.n - r.split) {}

  std::int64_t size() const { return count_; }

  dtrain::Batch gather(std::span<const std::int64_t> indices) const {
    const auto n = static_cast<std::int64_t>(indices.size());
    const auto pixels = static_cast<std::size_t>(r_.image[0] * r_.image[1] * r_.image[2]);
    const auto t = static_cast<std::size_t>(r_.tokens);
    std::vector<float> p;
    std::vector<std::int32_t> x, y;
    std::vector<std::int64_t> mask;
    for (const auto i : indices) {
      const auto k = static_cast<std::size_t>(first_ + i);
      p.insert(p.end(), r_.pixels.begin() + static_cast<std::ptrdiff_t>(k * pixels),
               r_.pixels.begin() + static_cast<std::ptrdiff_t>((k + 1) * pixels));
      x.insert(x.end(), r_.x.begin() + static_cast<std::ptrdiff_t>(k * t),
               r_.x.begin() + static_cast<std::ptrdiff_t>((k + 1) * t));
      y.insert(y.end(), r_.y.begin() + static_cast<std::ptrdiff_t>(k * t),
               r_.y.begin() + static_cast<std::ptrdiff_t>((k + 1) * t));
      if (!r_.mask.empty())
        mask.insert(mask.end(), r_.mask.begin() + static_cast<std::ptrdiff_t>(k * t),
                    r_.mask.begin() + static_cast<std::ptrdiff_t>((k + 1) * t));
    }
    dtrain::Batch b;
    b.set("pixel_values", dtrain::HostTensor::of(p, {n, r_.image[0], r_.image[1], r_.image[2]}));
    b.set("x", dtrain::HostTensor::of(x, {n, r_.tokens}));
    b.set("y", dtrain::HostTensor::of(y, {n, r_.tokens}));
    if (!mask.empty()) b.set("attention_mask", dtrain::HostTensor::of(mask, {n, r_.tokens}));
    return b;
  }

 private:
  const Records& r_;
  std::int64_t first_, count_;
};

namespace detail {

inline std::string shape_of(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

inline const char* const data_fix =
    "give a safetensors file of pixel_values float32 [N, C, H, W], input_ids and labels int64 or int32 [N, T] "
    "(optionally attention_mask [N, T]); docs/models_vision.md shows how to make one";

}  // namespace detail

// Reads and checks `file` against the model: every problem is a
// config_error naming it (and the record, for a record's), before anything
// starts.
inline Records read_records(const std::string& file, const dtrain::hf::LlavaConfig& config) {
  const std::string where = "data '" + file + "'";
  std::optional<dtrain::SafetensorsFile> opened;
  try {
    opened.emplace(dtrain::SafetensorsFile::open(file));
  } catch (const dtrain::error& e) {  // its problem only: the fix is ours
    throw dtrain::config_error(where + " is not a readable safetensors file: " + e.problem(), detail::data_fix);
  } catch (const std::exception& e) {
    throw dtrain::config_error(where + " is not a readable safetensors file: " + e.what(), detail::data_fix);
  }
  const dtrain::SafetensorsFile& f = *opened;
  const auto tensor = [&](const std::string& name, std::size_t rank, bool integer) {
    if (!f.contains(name)) throw dtrain::config_error(where + " has no tensor \"" + name + "\"", detail::data_fix);
    const dtrain::SafetensorsTensor t = f.tensor(name);
    const bool ok = integer ? t.dtype == dtrain::element_type::i64 || t.dtype == dtrain::element_type::i32
                            : t.dtype == dtrain::element_type::f32;
    if (!ok || t.shape.size() != rank)
      throw dtrain::config_error(where + ": \"" + name + "\" is " + std::string(dtrain::element_name(t.dtype)) + " " +
                                     detail::shape_of(t.shape) + ", not " +
                                     (integer ? "int64 or int32 [N, T]" : "float32 [N, C, H, W]"),
                                 detail::data_fix);
    return t.shape;
  };
  const auto pixels = tensor("pixel_values", 4, false), ids = tensor("input_ids", 2, true),
             labels = tensor("labels", 2, true);
  const bool masked = f.contains("attention_mask");
  const std::vector<std::int64_t> mask = masked ? tensor("attention_mask", 2, true) : ids;
  const std::int64_t n = pixels[0];
  for (const auto& [name, shape] :
       {std::pair{"input_ids", ids}, std::pair{"labels", labels}, std::pair{"attention_mask", mask}})
    if (shape[0] != n || (shape[1] != ids[1]))
      throw dtrain::config_error(where + ": \"" + std::string(name) + "\" is " + detail::shape_of(shape) +
                                     " but pixel_values holds " + std::to_string(n) + " images and input_ids is " +
                                     detail::shape_of(ids),
                                 "give every tensor one row per record, the id tensors as long as one another");
  const dtrain::hf::VisionConfig& v = config.vision;
  if (pixels[1] != v.num_channels || pixels[2] != v.image_size || pixels[3] != v.image_size)
    throw dtrain::config_error(where + ": the images are " + std::to_string(pixels[1]) + " x " +
                                   std::to_string(pixels[2]) + " x " + std::to_string(pixels[3]) +
                                   " (channels x height x width), the tower takes " + std::to_string(v.num_channels) +
                                   " x " + std::to_string(v.image_size) + " x " + std::to_string(v.image_size),
                               "resize the images to the tower's image_size (the model's processor does)");
  if (ids[1] > config.text.max_position_embeddings)
    throw dtrain::config_error(
        where + ": records of " + std::to_string(ids[1]) + " tokens are longer than the language model's " +
            std::to_string(config.text.max_position_embeddings) + " positions (max_position_embeddings)",
        "cut the records to at most " + std::to_string(config.text.max_position_embeddings) +
            " tokens (the padding after the longest one first)");
  if (n < 2)
    throw dtrain::config_error(
        where + " has " + std::to_string(n) + " record(s): too few for training records and a held-out tenth",
        "give at least 2 records");
  Records r;
  r.n = n;
  r.tokens = ids[1];
  r.image = {pixels[1], pixels[2], pixels[3]};
  r.pixels = f.read_f32("pixel_values");
  const std::vector<std::int64_t> in = f.read_i64("input_ids"), out = f.read_i64("labels");
  if (masked) r.mask = f.read_i64("attention_mask");
  const std::int64_t vocab = config.text.vocab_size, features = config.features_per_image(), t = r.tokens;
  r.x.resize(in.size());
  r.y.assign(in.size(), -100);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t images = 0;
    for (std::int64_t p = 0; p < t; ++p) {
      const auto k = static_cast<std::size_t>(i * t + p);
      if (in[k] < 0 || in[k] >= vocab)
        throw dtrain::config_error(where + ": record " + std::to_string(i) + " token " + std::to_string(p) + " is id " +
                                       std::to_string(in[k]) + ", outside the model's vocabulary of " +
                                       std::to_string(vocab),
                                   "tokenize with the model's own processor");
      if (out[k] != -100 && (out[k] < 0 || out[k] >= vocab))
        throw dtrain::config_error(where + ": record " + std::to_string(i) + " label " + std::to_string(p) + " is " +
                                       std::to_string(out[k]) +
                                       ", neither -100 nor an id of the model's vocabulary of " + std::to_string(vocab),
                                   "give labels as the ids, -100 where no loss is wanted");
      if (masked && r.mask[k] != 0 && r.mask[k] != 1)
        throw dtrain::config_error(
            where + ": record " + std::to_string(i) + " attention_mask holds " + std::to_string(r.mask[k]),
            "give attention_mask as 1 for a token, 0 for padding");
      images += in[k] == config.image_token ? 1 : 0;
      r.x[k] = static_cast<std::int32_t>(in[k]);
      if (p + 1 < t) r.y[k] = static_cast<std::int32_t>(out[k + 1]);
    }
    if (images != features)
      throw dtrain::config_error(where + ": record " + std::to_string(i) + " holds " + std::to_string(images) +
                                     " image tokens (id " + std::to_string(config.image_token) + "), the model makes " +
                                     std::to_string(features) + " features per image",
                                 "expand each image's token to " + std::to_string(features) +
                                     " as the model's processor does (one image per record)");
  }
  if (std::ranges::all_of(r.y, [](std::int32_t y) { return y == -100; }))
    throw dtrain::config_error(where + ": every label is -100 (after the shift by one): no token to learn",
                               "give labels as the ids of the text to learn, -100 only over the prompt, the image "
                               "tokens and the padding");
  r.split = n - std::max<std::int64_t>(1, n / 10);
  return r;
}

int train_host(const Config&, dtrain::World&, const dtrain::hf::Llava&, const Records&);
int train_cuda(const Config&, dtrain::World&, const dtrain::hf::Llava&, const Records&);

}  // namespace vlm
