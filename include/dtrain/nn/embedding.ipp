// The definitions embedding.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/nn/embedding.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  DTRAIN_DECL Embedding::Embedding(std::int64_t vocab, std::int64_t dim, EmbeddingOptions options)
      : vocab_(vocab), dim_(dim), options_(std::move(options)) {
    if (vocab < 1 || dim < 1)
      throw config_error("nn::Embedding(" + std::to_string(vocab) + ", " + std::to_string(dim) +
                             "): vocabulary and width must be >= 1",
                         "give the number of distinct ids and the vector width");
  }

  DTRAIN_DECL const DeviceTensor& Embedding::checked_ids(const DeviceBatch& batch, std::int64_t rows) const {
    const DeviceTensor& ids = batch.at(options_.input);
    if (ids.numel() != rows)
      throw config_error("nn::Embedding: " + std::to_string(ids.numel()) + " ids " + shape_text(ids.shape) + " for " +
                             std::to_string(rows) + " output rows",
                         "give one id per position: ids [B, T]");
    dispatch(ids, [&]<class Id>() {
      const Id* host = ids.host_data<Id>();
      for (std::int64_t r = 0; r < rows; ++r)
        if (host[r] < 0 || static_cast<std::int64_t>(host[r]) >= vocab_)
          throw config_error("nn::Embedding: id " + std::to_string(static_cast<std::int64_t>(host[r])) +
                                 " at position " + std::to_string(r) + " is outside [0, " + std::to_string(vocab_) +
                                 ")",
                             "ids index the vocabulary: check the tokenizer and the model's vocabulary size");
    });
    return ids;
  }

  DTRAIN_DECL PositionalEmbedding::PositionalEmbedding(std::int64_t max_len, std::int64_t dim, float init_std,
                                                       bool trainable)
      : max_len_(max_len), dim_(dim), init_std_(init_std), trainable_(trainable) {
    if (max_len < 1 || dim < 1)
      throw config_error("nn::PositionalEmbedding(" + std::to_string(max_len) + ", " + std::to_string(dim) +
                             "): length and width must be >= 1",
                         "give the longest sequence and the vector width");
  }

}  // namespace dtrain::nn

DTRAIN_IMPL_END
