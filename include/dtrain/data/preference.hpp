#pragma once
// Preference pairs for DPO (nn::PreferenceLoss): a prompt and two
// completions of it, the chosen and the rejected, as token ids; read from a
// .jsonl file of one object per line,
//   {"prompt_ids": [...], "chosen_ids": [...], "rejected_ids": [...]}
// optionally with "ref_chosen_logps" and "ref_rejected_logps" (the
// reference model's log-probability of each completion, precomputed), and
// made into batches in TRL's layout.
//
// preference_batch(pairs): 2P sequences, each pair's chosen one in row i
// and its rejected one in row P + i, every sequence its prompt followed by
// its completion: x the ids but the last, y the next ids with -100 where
// the next token is the prompt's (the loss and the log-probabilities count
// only the completion, as TRL's completion mask does), right-padded to the
// longest sequence (x with pad_id, y with -100; a causal model's earlier
// positions never see the padding). With every pair's reference
// log-probabilities the batch also holds "ref_logps" [2P] (f64).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"

namespace dtrain {

struct PreferencePair {
  std::vector<std::int32_t> prompt, chosen, rejected;
  std::optional<double> ref_chosen, ref_rejected;  // both or neither
};

// The pairs of `file`. A line that is not such an object, an empty prompt
// or completion, an id outside [0, vocab), a sequence (prompt and
// completion) longer than block + 1 tokens or one reference log-probability
// without the other is a config_error naming the file, the line and the fix.
DTRAIN_DECL std::vector<PreferencePair> read_preference_pairs(const std::filesystem::path& file, std::int64_t block,
                                                              std::int64_t vocab);

// The batch of `pairs` described above ("x", "y" int32 [2P, T], and
// "ref_logps" when every pair carries them; some with and some without is
// a config_error).
DTRAIN_DECL Batch preference_batch(std::span<const PreferencePair> pairs, std::int32_t pad_id = 0);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/data/preference.ipp"
#endif
