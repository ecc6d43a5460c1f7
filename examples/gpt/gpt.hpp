#pragma once
// The train_gpt example: the ready character-level GPT (dtrain/models/gpt.hpp:
// the model, its tokenizer and its text, a file's or a generated corpus)
// trained on windows of the text, and evaluated on its last tenth.

#include <cstdint>

#include "common/config.hpp"
#include "common/dispatch.hpp"
#include "common/windows.hpp"

#include <dtrain/models/gpt.hpp>
#include <dtrain/trainer.hpp>

namespace gpt {

// The model's keys (dtrain/models/gpt.hpp, which dtrain-estimate reads too)
// and the evaluation's.
struct Config : dtrain::models::GptConfig {
  std::int64_t eval_batches = 8;  // held-out batches per rank evaluated at the end
};

using Model = dtrain::models::Gpt;
using dtrain::models::Corpus;
using dtrain::models::make_corpus;
using examples::Windows;

int train_host(const Config&, dtrain::World&, const Corpus&);
int train_cuda(const Config&, dtrain::World&, const Corpus&);

}  // namespace gpt
