// The definitions image_merge.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/nn/image_merge.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  DTRAIN_DECL ImageTokenMerge::ImageTokenMerge(std::int64_t vocab, std::int64_t dim, std::int64_t image_token,
                                               EmbeddingOptions options, float feature_scale)
      : embed_(vocab, dim, options),
        dim_(dim),
        image_token_(image_token),
        options_(std::move(options)),
        feature_scale_(feature_scale) {
    if (image_token < 0 || image_token >= vocab)
      throw config_error("nn::ImageTokenMerge: the image token " + std::to_string(image_token) +
                             " is not an id of the " + std::to_string(vocab) + "-row embedding",
                         "give an image token id below the vocabulary size (the model's image_token_index)");
  }

  DTRAIN_DECL const DeviceBatch& ImageTokenMerge::checked_batch(const DeviceBatch* batch) const {
    if (batch == nullptr)
      throw config_error("nn::ImageTokenMerge: called without the batch",
                         "run the unit in a Trainer, or pass a UnitContext whose batch holds the ids");
    return *batch;
  }

  DTRAIN_DECL std::vector<std::int64_t> ImageTokenMerge::host_rows(const DeviceBatch& batch, std::int64_t feature_rows,
                                                                   std::int64_t text_rows, SeqShape in) const {
    if (!batch.contains(options_.input))
      throw config_error("nn::ImageTokenMerge: the batch has no ids '" + options_.input + "'",
                         "give the token ids as batch tensor '" + options_.input + "', int32 or int64 [B, T]");
    const DeviceTensor& ids = batch.at(options_.input);
    const std::int64_t sequences = ids.dim(0), time = ids.numel() / std::max<std::int64_t>(sequences, 1);
    if (ids.shape.size() != 2 || sequences * time != text_rows)
      throw config_error("nn::ImageTokenMerge: ids '" + options_.input + "' " + shape_text(ids.shape) + " for " +
                             std::to_string(text_rows) + " rows",
                         "give the ids as [B, T]");
    if (in.batch != sequences || feature_rows != in.rows())
      throw config_error("nn::ImageTokenMerge: " + std::to_string(in.batch) + " images for " +
                             std::to_string(sequences) + " sequences",
                         "give one image per sequence (pixel_values' first extent is the ids')");
    const std::int64_t per = in.time;
    std::vector<std::int64_t> rows;
    rows.reserve(static_cast<std::size_t>(feature_rows));
    const auto collect = [&]<class Id>(const Id* id) {
      for (std::int64_t b = 0; b < sequences; ++b) {
        std::int64_t found = 0;
        for (std::int64_t t = 0; t < time; ++t)
          if (static_cast<std::int64_t>(id[b * time + t]) == image_token_) {
            if (found++ < per) rows.push_back(b * time + t);
          }
        if (found != per)
          throw config_error("nn::ImageTokenMerge: sequence " + std::to_string(b) + " holds " + std::to_string(found) +
                                 " image tokens (id " + std::to_string(image_token_) + "), but its image gives " +
                                 std::to_string(per) + " features",
                             "expand each image's token to one per feature, " + std::to_string(per) +
                                 " in a row, as the model's processor writes the ids");
      }
    };
    if (ids.type == element_type::i32)
      collect(ids.host_data<std::int32_t>());
    else if (ids.type == element_type::i64)
      collect(ids.host_data<std::int64_t>());
    else
      throw config_error(
          "nn::ImageTokenMerge: ids '" + options_.input + "' hold " + std::string(element_name(ids.type)),
          "give token ids as int32 or int64");
    return rows;
  }
}  // namespace dtrain::nn

DTRAIN_IMPL_END
