#pragma once
// Resumable checkpoints: a directory of safetensors files and a JSON index.
//
//   <dir>/shard-00001-of-00003.safetensors   what rank 1 owns (pieces, below)
//   <dir>/model.safetensors                  consolidated fp32 parameters (when asked)
//   <dir>/index.json                         everything else; written last
//
// A piece is a run of one tensor's elements (in the flattened, row-major
// tensor): key "<kind>/<tensor>/<first element>" in a shard file, where kind
// is "param" (fp32 master weights, or a frozen parameter in its compute
// dtype) or an optimizer state ("exp_avg", "exp_avg_sq", "momentum_buffer").
// The index lists, for every tensor, its shape and its pieces per kind with
// their file, key, element range, dtype and CRC-32C, so a rank of any
// strategy at any world size reads exactly the elements it owns: resharding
// is a lookup, not a special case.
//
// Crash safety: every file is written under a temporary name, fsynced and
// renamed (safetensors.hpp's AtomicFile), and index.json the same way, last,
// after every rank's files are on disk: the index is the commit point. A
// directory without index.json is not a checkpoint (a save that died), and a
// directory with one is never written again.
//
// Verification: the index records each file's size and each piece's CRC-32C;
// a missing, truncated or altered file is reported naming the file and the
// piece before anything is loaded.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/data/sampler.hpp"
#include "dtrain/io/crc32c.hpp"
#include "dtrain/io/safetensors.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/strategy/strategy.hpp"
#include "dtrain/version.hpp"

namespace dtrain {

inline constexpr std::string_view checkpoint_format = "dtrain-checkpoint";
inline constexpr int checkpoint_format_version = 1;
inline constexpr std::string_view checkpoint_index_name = "index.json";
inline constexpr std::string_view checkpoint_model_name = "model.safetensors";

// Where a DistributedSampler stood, over all ranks: `global_position`
// samples of `epoch` consumed, counted in the epoch's permutation. The
// permutation does not depend on the world size and rank r takes every W-th
// entry from r, so the same global position resumes at any world size whose
// ranks split it evenly.
struct SamplerProgress {
  std::int64_t epoch = 0;
  std::int64_t global_position = 0;
  std::int64_t dataset_size = 0;
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;

  DTRAIN_DECL static SamplerProgress of(const DistributedSampler& s);

  // The state that continues this progress on sampler `s` (any world size).
  DTRAIN_DECL SamplerState state_for(const DistributedSampler& s) const;
};

// What a checkpoint holds besides tensors. Filled by the Trainer on save;
// returned by Trainer::load.
struct CheckpointInfo {
  std::int64_t step = 0;        // optimizer steps taken (the LR schedule's position)
  double loss_scale = 1.0;      // fp16 dynamic loss scale
  std::int64_t good_steps = 0;  // good steps since the scale last changed
  std::uint64_t seed = 0;       // the initialisation / RNG seed
  std::optional<SamplerProgress> sampler;
  std::map<std::string, std::string> metadata{};  // the user's own strings
  // Recorded at save time, for messages and checks:
  int world_size = 1;
  std::string strategy;
  std::string param_dtype, reduce_dtype;
  std::string optimizer;                      // "adamw", "sgd"
  std::vector<std::string> optimizer_states;  // state names, in FlatOptimizer::state() order
  // The parameter groups the run trained with: the default group first. A
  // resumed run applies its own settings; these are for comparing.
  struct Group {
    std::string name;
    float lr = 0.f;
    float weight_decay = 0.f;
    std::vector<std::string> params;
  };
  std::vector<Group> param_groups;  // empty for checkpoints written before groups existed
  std::string dtrain_version;
  std::filesystem::path dir;
};

struct SaveOptions {
  // Also write model.safetensors: every parameter in fp32 under its name
  // ("<unit>.<param>", the shapes the units declare), gathered unit by unit
  // (no rank holds more than one unit beyond its own shard), readable by
  // Python's safetensors and torch. The shard files then hold only optimizer
  // state. The checkpoint resumes at any world size either way.
  bool consolidated = false;
  // This rank's sampler (every rank passes its own): its position is saved,
  // as the position over all ranks (SamplerProgress).
  const DistributedSampler* sampler = nullptr;
  std::map<std::string, std::string> metadata{};  // the user's own strings
};

struct LoadOptions {
  // false: load parameters, step and loss scale, and keep this trainer's
  // optimizer state (e.g. a checkpoint of another optimizer).
  bool optimizer_state = true;
};

// Initial weights from a safetensors file (pretrained, or a consolidated
// checkpoint's model.safetensors).
struct LoadParamsOptions {
  // true: any missing, unexpected or mis-shaped tensor is an error (all of
  // them listed); false: load what matches, leave the rest as initialised,
  // and report what did not match (the fine-tuning case: a pretrained
  // backbone, a fresh head).
  bool strict = true;
  // Names in the file -> names in this model ("<unit>.<param>"), for files
  // written with other names. Unlisted names are used as they are.
  std::map<std::string, std::string> rename{};
  // Model tensors with one of these tags are left out: neither loaded nor
  // missing (a base checkpoint lacks the "lora" adapters).
  std::vector<std::string> skip_tags{};
  // Non-empty: only the model tensors with one of these tags, or named in
  // only_names, are loaded or missing (an adapter file holds the "lora"
  // adapters and the modules saved beside them).
  std::vector<std::string> only_tags{};
  std::vector<std::string> only_names{};
};

struct LoadParamsReport {
  std::vector<std::string> loaded;      // model tensors set from the file
  std::vector<std::string> missing;     // model tensors the file lacks (left as initialised)
  std::vector<std::string> unexpected;  // file tensors this model lacks (ignored)
  std::vector<std::string> mismatched;  // "name: [a] in the file, [b] in the model" (left as initialised)
};

// One rank's owned training state, copied to the host, laid out as its
// strategy holds it (OwnedFlat / frozen storage, described by Ownership).
template <Dtype T>
struct HostState {
  std::vector<float> master;                                          // owned().size
  std::vector<std::pair<std::string, std::vector<float>>> optimizer;  // per state: name, owned().size values
  std::vector<T> frozen;                                              // the strategy's frozen storage

  std::size_t bytes() const {
    std::size_t n = master.size() * sizeof(float) + frozen.size() * sizeof(T);
    for (const auto& st : optimizer) n += st.second.size() * sizeof(float);
    return n;
  }
};

namespace detail {

// Throws naming the first owned element (parameter or optimizer state) that
// is inf or NaN: a checkpoint never holds them.
template <class T>
void require_finite(const HostState<T>& s, const Ownership& own, const ModelLayout& layout) {
  const auto check = [&](const std::vector<float>& values, const std::string& what) {
    for (const OwnedRange& r : own.trainable)
      for (std::size_t i = 0; i < r.count; ++i) {
        const float v = values[r.offset + i];
        if (std::isfinite(v)) continue;
        const auto& unit = layout.units()[r.unit];
        const std::size_t at = unit.train_offset + r.begin + i;
        std::string name = "unit " + std::to_string(r.unit);
        for (const auto& slot : unit.params)
          if (slot.spec.trainable && slot.offset <= at &&
              at < slot.offset + static_cast<std::size_t>(slot.spec.numel()))
            name = slot.name;
        throw checkpoint_error("refusing to save: " + what + " of " + name + " holds " + std::to_string(v),
                               "a checkpoint never holds inf or NaN; find the step that produced it (the metrics' "
                               "loss and grad_norm) and resume from an earlier checkpoint, or train with "
                               "on_nonfinite = stop or skip so it cannot reach the parameters");
      }
  };
  if (!s.master.empty()) check(s.master, "the parameter");
  for (const auto& [name, values] : s.optimizer)
    if (!values.empty()) check(values, "the optimizer state '" + name + "'");
}

// " (this rank writes N bytes; F bytes are free in DIR)": what a failed
// write's message adds, so a full disk names itself.
DTRAIN_DECL std::string space_note(const std::filesystem::path& dir, std::size_t bytes);

DTRAIN_DECL std::string piece_key(std::string_view kind, std::string_view tensor, std::size_t first);

DTRAIN_DECL std::string shard_file_name(int rank, int world);

// A run of one parameter's elements inside an owned range: elements
// [tensor_begin, tensor_begin + count) of the flattened parameter live at
// index `local` of the rank's owned flat (or frozen storage).
struct OwnedPiece {
  const ParamSlot* slot;
  std::size_t tensor_begin;
  std::size_t count;
  std::size_t local;
};

// Splits owned ranges (of trainable or of frozen segments) into per-parameter pieces.
DTRAIN_DECL std::vector<OwnedPiece> owned_pieces(const ModelLayout& layout, std::span<const OwnedRange> ranges,
                                                 bool frozen, bool writers_only);

// Converts `count` elements of dtype `from` (F32, BF16, F16) into T.
template <Dtype T>
void convert_into(std::span<const std::byte> src, element_type from, T* dst, std::size_t count,
                  const std::string& what) {
  const auto decode = [&](std::size_t i) -> float {
    switch (from) {
      case element_type::f32: return load_element<float>(src, i);
      case element_type::bf16: return bf16_bits_to_float(load_element<std::uint16_t>(src, i));
      case element_type::f16: return fp16_bits_to_float(load_element<std::uint16_t>(src, i));
      default: break;
    }
    throw checkpoint_error(what + " has dtype " + std::string(safetensors_name(from)),
                           "parameters load from F32, BF16 or F16");
  };
  if (from == element_type_of<T>()) {
    std::memcpy(dst, src.data(), count * sizeof(T));
    return;
  }
  for (std::size_t i = 0; i < count; ++i) dst[i] = dtype_cast<T>(decode(i));
}

}  // namespace detail

// ---------------------------------------------------------------------------
// The index.

// A piece as the index records it.
struct CheckpointPiece {
  std::string file;
  std::string key;
  std::size_t begin = 0;  // first element of the flattened tensor
  std::size_t count = 0;
  element_type dtype = element_type::f32;
  std::uint32_t crc32c = 0;
};

struct CheckpointTensor {
  std::vector<std::int64_t> shape;
  bool trainable = true;
  std::map<std::string, std::vector<CheckpointPiece>> pieces;  // by kind: "param", "exp_avg", ...

  DTRAIN_DECL std::size_t numel() const;
};

struct CheckpointIndex {
  CheckpointInfo info;
  std::vector<std::string> order;  // tensor names in model order
  std::map<std::string, CheckpointTensor> tensors;
  std::map<std::string, std::uint64_t> files;  // file name -> size in bytes
};

namespace detail {

DTRAIN_DECL std::string index_text(const CheckpointIndex& idx);

inline checkpoint_error index_error(const std::filesystem::path& path, const std::string& problem) {
  return checkpoint_error(quoted_path(path) + " is not a valid dtrain checkpoint index: " + problem,
                          "the checkpoint is damaged or was not written by dtrain; load an older checkpoint");
}

[[noreturn]] inline void bad_index(const std::filesystem::path& path, const std::string& problem) {
  throw index_error(path, problem);
}

DTRAIN_DECL CheckpointIndex parse_index(const std::filesystem::path& dir);

// What one rank wrote for a save: its file (empty: none) and size, and each
// piece with the tensor and kind it belongs to. Ranks send it to rank 0 as
// text (written_text: JSON {"file", "bytes", "pieces": tensor -> kind ->
// [piece]}), which merge_written adds to the index.
struct WrittenPieces {
  std::string file;
  std::uint64_t bytes = 0;
  struct Entry {
    std::string tensor, kind;
    CheckpointPiece piece;
  };
  std::vector<Entry> pieces;
};
DTRAIN_DECL std::string written_text(const WrittenPieces& written);
DTRAIN_DECL void merge_written(CheckpointIndex& index, std::string_view text);

DTRAIN_DECL void sort_pieces(CheckpointIndex& index);

}  // namespace detail

// Whether `dir` holds a complete checkpoint (its index exists and parses).
DTRAIN_DECL bool is_checkpoint(const std::filesystem::path& dir);

// The step of the checkpoint in `dir` (reads the index).
inline CheckpointInfo checkpoint_info(const std::filesystem::path& dir) { return detail::parse_index(dir).info; }

// ---------------------------------------------------------------------------
// A directory of checkpoints (train_mlp's checkpoint_dir): step-00000100/...

DTRAIN_DECL std::filesystem::path checkpoint_path(const std::filesystem::path& parent, std::int64_t step);

// The complete checkpoints under `parent`, oldest first (by their index's step).
DTRAIN_DECL std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& parent);

DTRAIN_DECL std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& parent);

// Removes all but the newest `keep_last` complete checkpoints under
// `parent`, and the leftovers of saves that died before the newest complete
// one. Call it after a save committed (it never touches the newest).
DTRAIN_DECL void prune_checkpoints(const std::filesystem::path& parent, int keep_last);

// ---------------------------------------------------------------------------
// Writing: one rank's shard file.

namespace detail {

// Writes this rank's pieces (the ranges it is the writer of) to
// shard-<rank>-of-<world>.safetensors and returns their index records as
// text (written_text), with the file's size. With
// `params_elsewhere`, parameters go to model.safetensors instead (a
// consolidated save) and only optimizer state is written here.
template <Dtype T>
std::string write_rank_file(const std::filesystem::path& dir, int rank, int world, const ModelLayout& layout,
                            const Ownership& own, const HostState<T>& state, bool params_elsewhere) {
  const std::string file = shard_file_name(rank, world);
  WrittenPieces written;
  SafetensorsWriter writer;
  auto add = [&](std::string_view kind, const OwnedPiece& p, std::span<const std::byte> bytes, element_type dtype) {
    const std::string key = piece_key(kind, p.slot->name, p.tensor_begin);
    writer.add(key, dtype, {static_cast<std::int64_t>(p.count)}, bytes);
    written.pieces.push_back(
        {p.slot->name, std::string(kind), {file, key, p.tensor_begin, p.count, dtype, crc32c(bytes)}});
  };
  for (const auto& p : owned_pieces(layout, own.trainable, false, true)) {
    if (!params_elsewhere)
      add("param", p, std::as_bytes(std::span(state.master).subspan(p.local, p.count)), element_type::f32);
    for (const auto& [name, values] : state.optimizer)
      add(name, p, std::as_bytes(std::span(values).subspan(p.local, p.count)), element_type::f32);
  }
  if (!params_elsewhere)
    for (const auto& p : owned_pieces(layout, own.frozen, true, true))
      add("param", p, std::as_bytes(std::span(state.frozen).subspan(p.local, p.count)), element_type_of<T>());
  if (writer.size() == 0) return written_text(written);
  writer.write(dir / file);
  written.file = file;
  written.bytes = std::filesystem::file_size(dir / file);
  return written_text(written);
}

// Removes what a save that died may have left in `dir` (only dtrain's own
// file names: `dir` may be a user's directory).
DTRAIN_DECL void clear_partial_save(const std::filesystem::path& dir);

}  // namespace detail

// ---------------------------------------------------------------------------
// Reading: fills one rank's owned state from a checkpoint's pieces.

namespace detail {

// Opens each file once, checks its recorded size, and verifies each piece's
// CRC the first time it is read.
class PieceReader {
 public:
  PieceReader(const std::filesystem::path& dir, const std::map<std::string, std::uint64_t>& sizes)
      : dir_(dir), sizes_(sizes) {}

  // The bytes of `p` (whole piece), verified.
  DTRAIN_DECL std::span<const std::byte> bytes(const std::string& tensor, const std::string& kind,
                                               const CheckpointPiece& p);

 private:
  DTRAIN_DECL const SafetensorsFile& open(const std::string& file);

  std::filesystem::path dir_;
  const std::map<std::string, std::uint64_t>& sizes_;
  std::map<std::string, SafetensorsFile> files_;
  std::map<std::string, bool> verified_;
};

// Copies elements [begin, begin + count) of `tensor`'s `kind` from its
// pieces into dst (converted to T); throws if the pieces do not cover them.
template <Dtype T>
void read_elements(PieceReader& reader, const std::string& tensor, const std::string& kind,
                   const std::vector<CheckpointPiece>& pieces, std::size_t begin, std::size_t count, T* dst) {
  std::size_t at = begin;
  const std::size_t end = begin + count;
  while (at < end) {
    const auto it =
        std::ranges::find_if(pieces, [&](const CheckpointPiece& p) { return p.begin <= at && at < p.begin + p.count; });
    if (it == pieces.end())
      throw checkpoint_error("the checkpoint holds no " + kind + " for elements [" + std::to_string(at) + ", " +
                                 std::to_string(end) + ") of tensor '" + tensor + "'",
                             "the index is incomplete; load an older checkpoint");
    const std::size_t n = std::min(end, it->begin + it->count) - at;
    const auto bytes = reader.bytes(tensor, kind, *it);
    const std::size_t elem = element_bytes(it->dtype);
    convert_into(bytes.subspan((at - it->begin) * elem, n * elem), it->dtype, dst + (at - begin), n,
                 "piece '" + it->key + "'");
    at += n;
  }
}

}  // namespace detail

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/checkpoint/checkpoint.ipp"
#endif
