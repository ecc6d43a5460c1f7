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
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtrain/io/crc32c.hpp"
#include "dtrain/io/safetensors.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/data/sampler.hpp"
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

  static SamplerProgress of(const DistributedSampler& s) {
    const auto st = s.state();
    return {st.epoch, st.position * s.world_size(), s.dataset_size(), s.options().seed, s.options().shuffle,
            s.options().drop_last};
  }

  // The state that continues this progress on sampler `s` (any world size).
  SamplerState state_for(const DistributedSampler& s) const {
    if (s.dataset_size() != dataset_size || s.options().seed != seed || s.options().shuffle != shuffle ||
        s.options().drop_last != drop_last)
      throw config_error("the checkpoint's sampler drew from " + std::to_string(dataset_size) + " rows (seed " +
                             std::to_string(seed) + ", shuffle " + (shuffle ? "on" : "off") + ", drop_last " +
                             (drop_last ? "on" : "off") + ") but this sampler draws from " +
                             std::to_string(s.dataset_size()) + " rows (seed " + std::to_string(s.options().seed) +
                             ", shuffle " + (s.options().shuffle ? "on" : "off") + ", drop_last " +
                             (s.options().drop_last ? "on" : "off") + ")",
                         "resume with the same dataset and sampler options, or start a new epoch "
                         "(sampler.set_epoch) instead of restoring the position");
    if (global_position % s.world_size() != 0)
      throw config_error("the checkpoint consumed " + std::to_string(global_position) + " samples of epoch " +
                             std::to_string(epoch) + ", which " + std::to_string(s.world_size()) +
                             " ranks cannot split evenly",
                         "resume at a world size that divides the global batch (ranks x batch x accumulate)");
    return {epoch, global_position / s.world_size()};
  }
};

// What a checkpoint holds besides tensors. Filled by the Trainer on save;
// returned by Trainer::load.
struct CheckpointInfo {
  std::int64_t step = 0;            // optimizer steps taken (the LR schedule's position)
  double loss_scale = 1.0;          // fp16 dynamic loss scale
  std::int64_t good_steps = 0;      // good steps since the scale last changed
  std::uint64_t seed = 0;           // the initialisation / RNG seed
  std::optional<SamplerProgress> sampler;
  std::map<std::string, std::string> metadata{};  // the user's own strings
  // Recorded at save time, for messages and checks:
  int world_size = 1;
  std::string strategy;
  std::string param_dtype, reduce_dtype;
  std::string optimizer;            // "adamw", "sgd"
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
  std::vector<float> master;                                     // owned().size
  std::vector<std::pair<std::string, std::vector<float>>> optimizer;  // per state: name, owned().size values
  std::vector<T> frozen;                                         // the strategy's frozen storage

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
          if (slot.spec.trainable && slot.offset <= at && at < slot.offset + static_cast<std::size_t>(slot.spec.numel()))
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
inline std::string space_note(const std::filesystem::path& dir, std::size_t bytes) {
  std::error_code ec;
  const auto space = std::filesystem::space(dir, ec);
  std::string note = " (this rank writes " + std::to_string(bytes) + " bytes";
  if (!ec) note += "; " + std::to_string(space.available) + " bytes are free in " + dir.string();
  return note + ")";
}

inline std::string piece_key(std::string_view kind, std::string_view tensor, std::size_t first) {
  return std::string(kind) + "/" + std::string(tensor) + "/" + std::to_string(first);
}

inline std::string shard_file_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%05d-of-%05d.safetensors", rank, world);
  return name;
}

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
inline std::vector<OwnedPiece> owned_pieces(const ModelLayout& layout, std::span<const OwnedRange> ranges,
                                            bool frozen, bool writers_only) {
  std::vector<OwnedPiece> out;
  for (const OwnedRange& r : ranges) {
    if (writers_only && !r.writer) continue;
    const UnitSlots& unit = layout.units()[r.unit];
    const std::size_t segment = frozen ? unit.frozen_offset : unit.train_offset;
    for (const ParamSlot& slot : unit.params) {
      if (slot.spec.trainable == frozen) continue;
      const std::size_t first = slot.offset - segment, n = static_cast<std::size_t>(slot.spec.numel());
      const std::size_t lo = std::max(first, r.begin), hi = std::min(first + n, r.begin + r.count);
      if (lo >= hi) continue;
      out.push_back({&slot, lo - first, hi - lo, r.offset + (lo - r.begin)});
    }
  }
  return out;
}

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
  std::size_t begin = 0;   // first element of the flattened tensor
  std::size_t count = 0;
  element_type dtype = element_type::f32;
  std::uint32_t crc32c = 0;
};

struct CheckpointTensor {
  std::vector<std::int64_t> shape;
  bool trainable = true;
  std::map<std::string, std::vector<CheckpointPiece>> pieces;  // by kind: "param", "exp_avg", ...

  std::size_t numel() const {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
};

struct CheckpointIndex {
  CheckpointInfo info;
  std::vector<std::string> order;                    // tensor names in model order
  std::map<std::string, CheckpointTensor> tensors;
  std::map<std::string, std::uint64_t> files;        // file name -> size in bytes
};

namespace detail {

template <class Json = nlohmann::ordered_json>
Json piece_json(const CheckpointPiece& p) {
  return {{"file", p.file}, {"key", p.key}, {"begin", p.begin}, {"count", p.count},
          {"dtype", safetensors_name(p.dtype)}, {"crc32c", p.crc32c}};
}

[[noreturn]] inline void bad_index(const std::filesystem::path& path, const std::string& problem);

// An integer field of the index, range-checked. nlohmann's get<T>() converts
// without a check: a float such as 7e90 (undefined behaviour, found by
// fuzzing) or an integer that does not fit T; a damaged index is an error.
template <std::integral T, class Json>
T index_integer(const Json& v, std::string_view field, const std::filesystem::path& where) {
  if (v.is_number_unsigned()) {
    if (const auto u = v.template get<std::uint64_t>(); std::in_range<T>(u)) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    if (const auto i = v.template get<std::int64_t>(); std::in_range<T>(i)) return static_cast<T>(i);
  }
  std::string shown = v.dump();
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  bad_index(where, "\"" + std::string(field) + "\" is " + shown + ", where an integer from " +
                       std::to_string(std::numeric_limits<T>::min()) + " to " +
                       std::to_string(std::numeric_limits<T>::max()) + " belongs");
}

template <class Json>
std::vector<std::int64_t> index_shape(const Json& v, std::string_view field, const std::filesystem::path& where) {
  if (!v.is_array()) bad_index(where, "\"" + std::string(field) + "\" is not a list of extents");
  std::vector<std::int64_t> shape;
  for (const auto& d : v) shape.push_back(index_integer<std::int64_t>(d, field, where));
  return shape;
}

template <class Json>
CheckpointPiece piece_from_json(const Json& p, const std::filesystem::path& where) {
  const auto dtype = parse_element_type(p.at("dtype").template get<std::string>());
  if (!dtype) bad_index(where, "a piece has the unknown dtype " + p.at("dtype").dump());
  return {p.at("file").template get<std::string>(), p.at("key").template get<std::string>(),
          index_integer<std::size_t>(p.at("begin"), "begin", where),
          index_integer<std::size_t>(p.at("count"), "count", where), *dtype,
          index_integer<std::uint32_t>(p.at("crc32c"), "crc32c", where)};
}

inline std::string index_text(const CheckpointIndex& idx) {
  const CheckpointInfo& i = idx.info;
  nlohmann::ordered_json j;
  j["format"] = checkpoint_format;
  j["format_version"] = checkpoint_format_version;
  j["dtrain_version"] = std::string(version);
  j["step"] = i.step;
  j["loss_scale"] = i.loss_scale;
  j["good_steps"] = i.good_steps;
  j["rng"] = {{"seed", i.seed}};
  j["world_size"] = i.world_size;
  j["strategy"] = i.strategy;
  j["precision"] = {{"param", i.param_dtype}, {"reduce", i.reduce_dtype}};
  j["optimizer"] = {{"name", i.optimizer}, {"states", i.optimizer_states}};
  auto groups = nlohmann::ordered_json::array();
  for (const auto& g : i.param_groups)
    groups.push_back({{"name", g.name}, {"lr", g.lr}, {"weight_decay", g.weight_decay}, {"params", g.params}});
  j["optimizer"]["param_groups"] = std::move(groups);
  if (i.sampler)
    j["sampler"] = {{"epoch", i.sampler->epoch},         {"global_position", i.sampler->global_position},
                    {"dataset_size", i.sampler->dataset_size}, {"seed", i.sampler->seed},
                    {"shuffle", i.sampler->shuffle},     {"drop_last", i.sampler->drop_last}};
  else
    j["sampler"] = nullptr;
  j["metadata"] = i.metadata;
  j["tensors"] = nlohmann::ordered_json::object();
  for (const auto& name : idx.order) {
    const CheckpointTensor& t = idx.tensors.at(name);
    nlohmann::ordered_json pieces = nlohmann::ordered_json::object();
    for (const auto& [kind, list] : t.pieces) {
      auto arr = nlohmann::ordered_json::array();
      for (const auto& p : list) arr.push_back(piece_json<nlohmann::ordered_json>(p));
      pieces[kind] = std::move(arr);
    }
    j["tensors"][name] = {{"shape", t.shape}, {"trainable", t.trainable}, {"pieces", std::move(pieces)}};
  }
  j["files"] = nlohmann::ordered_json::object();
  for (const auto& [file, bytes] : idx.files) j["files"][file] = {{"bytes", bytes}};
  return j.dump(1);
}

[[noreturn]] inline void bad_index(const std::filesystem::path& path, const std::string& problem) {
  throw checkpoint_error(quoted_path(path) + " is not a valid dtrain checkpoint index: " + problem,
                         "the checkpoint is damaged or was not written by dtrain; load an older checkpoint");
}

inline CheckpointIndex parse_index(const std::filesystem::path& dir) {
  const auto path = dir / checkpoint_index_name;
  std::ifstream in(path);
  if (!in)
    throw checkpoint_error(quoted_path(dir) + " is not a checkpoint: it has no " + std::string(checkpoint_index_name) +
                               (std::filesystem::exists(dir) ? " (a save that did not finish leaves none)" : " (the directory does not exist)"),
                           "pass a checkpoint directory, or resume=latest to take the newest complete one");
  nlohmann::ordered_json j;  // ordered: the tensors' order is the model's
  try {
    j = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    bad_index(path, std::string("not JSON: ") + e.what());
  }
  CheckpointIndex idx;
  try {
    if (j.value("format", "") != checkpoint_format) bad_index(path, "its \"format\" is not \"dtrain-checkpoint\"");
    const auto integer = [&](const auto& v, std::string_view field) {
      return index_integer<std::int64_t>(v, field, path);
    };
    if (const auto v = integer(j.at("format_version"), "format_version"); v > checkpoint_format_version)
      bad_index(path, "format version " + std::to_string(v) + " is newer than this dtrain reads (" +
                          std::to_string(checkpoint_format_version) + ")");
    CheckpointInfo& i = idx.info;
    i.dir = dir;
    i.dtrain_version = j.at("dtrain_version").get<std::string>();
    i.step = integer(j.at("step"), "step");
    i.loss_scale = j.at("loss_scale").get<double>();
    i.good_steps = integer(j.at("good_steps"), "good_steps");
    i.seed = index_integer<std::uint64_t>(j.at("rng").at("seed"), "seed", path);
    i.world_size = index_integer<int>(j.at("world_size"), "world_size", path);
    i.strategy = j.at("strategy").get<std::string>();
    i.param_dtype = j.at("precision").at("param").get<std::string>();
    i.reduce_dtype = j.at("precision").at("reduce").get<std::string>();
    i.optimizer = j.at("optimizer").at("name").get<std::string>();
    i.optimizer_states = j.at("optimizer").at("states").get<std::vector<std::string>>();
    if (const auto& o = j.at("optimizer"); o.contains("param_groups"))
      for (const auto& g : o.at("param_groups"))
        i.param_groups.push_back({g.at("name").get<std::string>(), g.at("lr").get<float>(),
                                  g.at("weight_decay").get<float>(), g.at("params").get<std::vector<std::string>>()});
    if (const auto& s = j.at("sampler"); !s.is_null())
      i.sampler = SamplerProgress{integer(s.at("epoch"), "epoch"),
                                  integer(s.at("global_position"), "global_position"),
                                  integer(s.at("dataset_size"), "dataset_size"),
                                  index_integer<std::uint64_t>(s.at("seed"), "seed", path),
                                  s.at("shuffle").get<bool>(),
                                  s.at("drop_last").get<bool>()};
    i.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
    for (const auto& [name, t] : j.at("tensors").items()) {
      CheckpointTensor ct;
      ct.shape = index_shape(t.at("shape"), "shape", path);
      ct.trainable = t.at("trainable").get<bool>();
      for (const auto& [kind, list] : t.at("pieces").items())
        for (const auto& p : list) ct.pieces[kind].push_back(piece_from_json(p, path));
      idx.order.push_back(name);
      idx.tensors.emplace(name, std::move(ct));
    }
    for (const auto& [file, f] : j.at("files").items())
      idx.files[file] = index_integer<std::uint64_t>(f.at("bytes"), "bytes", path);
  } catch (const nlohmann::json::exception& e) {
    bad_index(path, std::string("a field is missing or has the wrong type: ") + e.what());
  }
  return idx;
}

// Adds one rank's written pieces ({"file", "bytes", "pieces": tensor ->
// kind -> [piece]}, as write_rank_file returns them) to the index.
inline void merge_written(CheckpointIndex& index, const nlohmann::ordered_json& written) {
  if (!written.contains("file")) return;  // this rank wrote nothing
  index.files[written.at("file").get<std::string>()] = written.at("bytes").get<std::uint64_t>();
  for (const auto& [tensor, kinds] : written.at("pieces").items())
    for (const auto& [kind, list] : kinds.items())
      for (const auto& p : list) index.tensors.at(tensor).pieces[kind].push_back(piece_from_json(p, "<save>"));
}

inline void sort_pieces(CheckpointIndex& index) {
  for (auto& [name, t] : index.tensors)
    for (auto& [kind, list] : t.pieces) std::ranges::sort(list, {}, &CheckpointPiece::begin);
}

}  // namespace detail

// Whether `dir` holds a complete checkpoint (its index exists and parses).
inline bool is_checkpoint(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / checkpoint_index_name)) return false;
  try {
    detail::parse_index(dir);
    return true;
  } catch (const checkpoint_error&) {
    return false;
  }
}

// The step of the checkpoint in `dir` (reads the index).
inline CheckpointInfo checkpoint_info(const std::filesystem::path& dir) { return detail::parse_index(dir).info; }

// ---------------------------------------------------------------------------
// A directory of checkpoints (train_mlp's checkpoint_dir): step-00000100/...

inline std::filesystem::path checkpoint_path(const std::filesystem::path& parent, std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return parent / name;
}

// The complete checkpoints under `parent`, oldest first (by their index's step).
inline std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& parent) {
  std::vector<std::pair<std::int64_t, std::filesystem::path>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(parent, ec)) {
    if (!entry.is_directory() || !entry.path().filename().string().starts_with("step-")) continue;
    try {
      found.emplace_back(detail::parse_index(entry.path()).info.step, entry.path());
    } catch (const checkpoint_error&) {
      // incomplete (no index: a save that died) or damaged: not a checkpoint
    }
  }
  std::ranges::sort(found);
  std::vector<std::filesystem::path> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

inline std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& parent) {
  auto all = list_checkpoints(parent);
  if (all.empty()) return std::nullopt;
  return all.back();
}

// Removes all but the newest `keep_last` complete checkpoints under
// `parent`, and the leftovers of saves that died before the newest complete
// one. Call it after a save committed (it never touches the newest).
inline void prune_checkpoints(const std::filesystem::path& parent, int keep_last) {
  if (keep_last < 1) return;
  const auto complete = list_checkpoints(parent);
  if (complete.empty()) return;
  const std::int64_t newest = detail::parse_index(complete.back()).info.step;
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_last) < complete.size(); ++i)
    std::filesystem::remove_all(complete[i]);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(parent, ec)) {
    const auto name = entry.path().filename().string();
    if (!entry.is_directory() || !name.starts_with("step-") || is_checkpoint(entry.path())) continue;
    std::int64_t step = 0;
    const auto digits = std::string_view(name).substr(5);
    if (std::from_chars(digits.data(), digits.data() + digits.size(), step).ec == std::errc{} && step < newest)
      std::filesystem::remove_all(entry.path());
  }
  detail::sync_directory(parent, "pruned checkpoints in " + detail::quoted_path(parent));
}

// ---------------------------------------------------------------------------
// Writing: one rank's shard file.

namespace detail {

// Writes this rank's pieces (the ranges it is the writer of) to
// shard-<rank>-of-<world>.safetensors and returns their index records as
// JSON (tensor -> kind -> pieces), plus the file's size. With
// `params_elsewhere`, parameters go to model.safetensors instead (a
// consolidated save) and only optimizer state is written here.
template <Dtype T>
nlohmann::ordered_json write_rank_file(const std::filesystem::path& dir, int rank, int world, const ModelLayout& layout,
                               const Ownership& own, const HostState<T>& state, bool params_elsewhere) {
  const std::string file = shard_file_name(rank, world);
  nlohmann::ordered_json records = nlohmann::ordered_json::object();
  SafetensorsWriter writer;
  auto add = [&](std::string_view kind, const OwnedPiece& p, std::span<const std::byte> bytes,
                 element_type dtype) {
    const std::string key = piece_key(kind, p.slot->name, p.tensor_begin);
    writer.add(key, dtype, {static_cast<std::int64_t>(p.count)}, bytes);
    records[p.slot->name][std::string(kind)].push_back(
        piece_json({file, key, p.tensor_begin, p.count, dtype, crc32c(bytes)}));
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
  nlohmann::ordered_json out = {{"pieces", records}};
  if (writer.size() == 0) return out;
  writer.write(dir / file);
  out["file"] = file;
  out["bytes"] = std::filesystem::file_size(dir / file);
  return out;
}

// Removes what a save that died may have left in `dir` (only dtrain's own
// file names: `dir` may be a user's directory).
inline void clear_partial_save(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    const bool ours = (name.starts_with("shard-") && (name.ends_with(".safetensors") || name.ends_with(".tmp"))) ||
                      name == checkpoint_model_name || name == std::string(checkpoint_model_name) + ".tmp" ||
                      name == std::string(checkpoint_index_name) + ".tmp";
    if (ours) std::filesystem::remove(entry.path(), ec);
  }
}

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
  std::span<const std::byte> bytes(const std::string& tensor, const std::string& kind, const CheckpointPiece& p) {
    const std::string what = "piece '" + p.key + "' (" + kind + " of " + tensor + ", elements [" +
                              std::to_string(p.begin) + ", " + std::to_string(p.begin + p.count) + ")) in " +
                              quoted_path(dir_ / p.file);
    const SafetensorsFile& f = open(p.file);
    if (!f.contains(p.key))
      throw checkpoint_error(what + " is missing from the file", "the file does not belong to this checkpoint; restore it or load an older checkpoint");
    const auto t = f.tensor(p.key);
    if (t.dtype != p.dtype || static_cast<std::size_t>(t.numel()) != p.count)
      throw checkpoint_error(what + " has dtype " + std::string(safetensors_name(t.dtype)) + " and " +
                                 std::to_string(t.numel()) + " elements in the file",
                             "the file does not belong to this checkpoint; restore it or load an older checkpoint");
    const std::string id = p.file + "\n" + p.key;
    if (!verified_.contains(id)) {
      if (crc32c(t.bytes) != p.crc32c)
        throw checkpoint_error(what + " fails its checksum (CRC-32C " + std::to_string(crc32c(t.bytes)) +
                                   ", the index recorded " + std::to_string(p.crc32c) + ")",
                               "the file was altered or damaged after it was saved; restore it or load an older "
                               "checkpoint");
      verified_.emplace(id, true);
    }
    return t.bytes;
  }

 private:
  const SafetensorsFile& open(const std::string& file) {
    if (auto it = files_.find(file); it != files_.end()) return it->second;
    const auto path = dir_ / file;
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec)
      throw checkpoint_error("checkpoint file " + quoted_path(path) + " is missing",
                             "restore the file, or load an older checkpoint");
    if (const auto it = sizes_.find(file); it != sizes_.end() && it->second != size)
      throw checkpoint_error("checkpoint file " + quoted_path(path) + " has " + std::to_string(size) +
                                 " bytes but the index recorded " + std::to_string(it->second) +
                                 (size < it->second ? " (truncated)" : ""),
                             "restore the file, or load an older checkpoint");
    return files_.emplace(file, SafetensorsFile::open(path)).first->second;
  }

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
    const auto it = std::ranges::find_if(pieces, [&](const CheckpointPiece& p) { return p.begin <= at && at < p.begin + p.count; });
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
