// The definitions checkpoint.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/io/json.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL auto SamplerProgress::of(const DistributedSampler& s)->SamplerProgress {
    const auto st = s.state();
    return {st.epoch,         st.position * s.world_size(), s.dataset_size(),
            s.options().seed, s.options().shuffle,          s.options().drop_last};
  }

  DTRAIN_DECL auto SamplerProgress::state_for(const DistributedSampler& s) const->SamplerState {
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
}  // namespace dtrain

namespace dtrain {

namespace detail {

template <class Json = nlohmann::ordered_json>
Json piece_json(const CheckpointPiece& p) {
  return {
      {"file", p.file},    {"key", p.key}, {"begin", p.begin}, {"count", p.count}, {"dtype", safetensors_name(p.dtype)},
      {"crc32c", p.crc32c}};
}

// A number field of the index, range-checked (json_number): a damaged
// index is an error, never a silent conversion.
template <class T, class Json>
T index_number(const Json& v, std::string_view field, const std::filesystem::path& where) {
  if (const auto x = json_number<T>(v)) return *x;
  if constexpr (std::is_integral_v<T>)
    bad_index(where, "\"" + std::string(field) + "\" is " + json_shown(v) + ", where an integer from " +
                         std::to_string(std::numeric_limits<T>::min()) + " to " +
                         std::to_string(std::numeric_limits<T>::max()) + " belongs");
  else
    bad_index(where, "\"" + std::string(field) + "\" is " + json_shown(v) + ", where a finite number belongs");
}

template <class Json>
std::vector<std::int64_t> index_shape(const Json& v, std::string_view field, const std::filesystem::path& where) {
  if (!v.is_array()) bad_index(where, "\"" + std::string(field) + "\" is not a list of extents");
  std::vector<std::int64_t> shape;
  for (const auto& d : v) shape.push_back(index_number<std::int64_t>(d, field, where));
  return shape;
}

template <class Json>
CheckpointPiece piece_from_json(const Json& p, const std::filesystem::path& where) {
  const auto dtype = parse_element_type(p.at("dtype").template get<std::string>());
  if (!dtype) bad_index(where, "a piece has the unknown dtype " + p.at("dtype").dump());
  return {p.at("file").template get<std::string>(),
          p.at("key").template get<std::string>(),
          index_number<std::size_t>(p.at("begin"), "begin", where),
          index_number<std::size_t>(p.at("count"), "count", where),
          *dtype,
          index_number<std::uint32_t>(p.at("crc32c"), "crc32c", where)};
}

DTRAIN_DECL std::string space_note(const std::filesystem::path& dir, std::size_t bytes) {
  std::error_code ec;
  const auto space = std::filesystem::space(dir, ec);
  std::string note = " (this rank writes " + std::to_string(bytes) + " bytes";
  if (!ec) note += "; " + std::to_string(space.available) + " bytes are free in " + dir.string();
  return note + ")";
}

DTRAIN_DECL std::string piece_key(std::string_view kind, std::string_view tensor, std::size_t first) {
  return std::string(kind) + "/" + std::string(tensor) + "/" + std::to_string(first);
}

DTRAIN_DECL std::vector<OwnedPiece> owned_pieces(const ModelLayout& layout, std::span<const OwnedRange> ranges,
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

DTRAIN_DECL std::string shard_file_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%05d-of-%05d.safetensors", rank, world);
  return name;
}
}  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL auto CheckpointTensor::numel() const -> std::size_t {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}
}  // namespace dtrain

namespace dtrain {

namespace detail {

DTRAIN_DECL std::string index_text(const CheckpointIndex& idx) {
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
    j["sampler"] = {{"epoch", i.sampler->epoch},
                    {"global_position", i.sampler->global_position},
                    {"dataset_size", i.sampler->dataset_size},
                    {"seed", i.sampler->seed},
                    {"shuffle", i.sampler->shuffle},
                    {"drop_last", i.sampler->drop_last}};
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

DTRAIN_DECL CheckpointIndex parse_index(const std::filesystem::path& dir) {
  const auto path = dir / checkpoint_index_name;
  std::ifstream in(path);
  if (!in)
    throw checkpoint_error(quoted_path(dir) + " is not a checkpoint: it has no " + std::string(checkpoint_index_name) +
                               (std::filesystem::exists(dir) ? " (a save that did not finish leaves none)"
                                                             : " (the directory does not exist)"),
                           "pass a checkpoint directory, or resume=latest to take the newest complete one");
  // ordered: the tensors' order is the model's
  const auto j = parse_json(in, [&](const std::string& problem) { return index_error(path, problem); });
  CheckpointIndex idx;
  try {
    if (j.value("format", "") != checkpoint_format) bad_index(path, "its \"format\" is not \"dtrain-checkpoint\"");
    const auto integer = [&](const auto& v, std::string_view field) {
      return index_number<std::int64_t>(v, field, path);
    };
    if (const auto v = integer(j.at("format_version"), "format_version"); v > checkpoint_format_version)
      bad_index(path, "format version " + std::to_string(v) + " is newer than this dtrain reads (" +
                          std::to_string(checkpoint_format_version) + ")");
    CheckpointInfo& i = idx.info;
    i.dir = dir;
    i.dtrain_version = j.at("dtrain_version").get<std::string>();
    i.step = integer(j.at("step"), "step");
    i.loss_scale = index_number<double>(j.at("loss_scale"), "loss_scale", path);
    i.good_steps = integer(j.at("good_steps"), "good_steps");
    i.seed = index_number<std::uint64_t>(j.at("rng").at("seed"), "seed", path);
    i.world_size = index_number<int>(j.at("world_size"), "world_size", path);
    i.strategy = j.at("strategy").get<std::string>();
    i.param_dtype = j.at("precision").at("param").get<std::string>();
    i.reduce_dtype = j.at("precision").at("reduce").get<std::string>();
    i.optimizer = j.at("optimizer").at("name").get<std::string>();
    i.optimizer_states = j.at("optimizer").at("states").get<std::vector<std::string>>();
    if (const auto& o = j.at("optimizer"); o.contains("param_groups"))
      for (const auto& g : o.at("param_groups"))
        i.param_groups.push_back({g.at("name").get<std::string>(), index_number<float>(g.at("lr"), "lr", path),
                                  index_number<float>(g.at("weight_decay"), "weight_decay", path),
                                  g.at("params").get<std::vector<std::string>>()});
    if (const auto& s = j.at("sampler"); !s.is_null())
      i.sampler = SamplerProgress{integer(s.at("epoch"), "epoch"),
                                  integer(s.at("global_position"), "global_position"),
                                  integer(s.at("dataset_size"), "dataset_size"),
                                  index_number<std::uint64_t>(s.at("seed"), "seed", path),
                                  s.at("shuffle").get<bool>(),
                                  s.at("drop_last").get<bool>()};
    i.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
    // Every file the index names is checked to lie in `dir` once, here
    // (contained_path), so that a checkpoint from elsewhere cannot make a
    // load read other files; PieceReader checks again where it opens them.
    std::set<std::string> files_named;
    const auto name_file = [&](const std::string& file) {
      if (files_named.insert(file).second) (void)contained_path(dir, file, quoted_path(path));
    };
    for (const auto& [name, t] : j.at("tensors").items()) {
      CheckpointTensor ct;
      ct.shape = index_shape(t.at("shape"), "shape", path);
      // Pieces are runs of the flattened tensor: each must lie inside it,
      // which also keeps begin + count from overflowing where they are read.
      const auto numel = shape_bytes(ct.shape, 1);
      if (!numel)
        bad_index(path, "tensor '" + name + "' has the shape " + shape_text(ct.shape) +
                            ", with a negative extent or more elements than an index can count");
      ct.trainable = t.at("trainable").get<bool>();
      for (const auto& [kind, list] : t.at("pieces").items())
        for (const auto& p : list) {
          auto piece = piece_from_json(p, path);
          if (piece.begin > *numel || piece.count > *numel - piece.begin)
            bad_index(path, "piece '" + piece.key + "' of tensor '" + name + "' claims " + std::to_string(piece.count) +
                                " elements from element " + std::to_string(piece.begin) + ", beyond the tensor's " +
                                std::to_string(*numel));
          name_file(piece.file);
          ct.pieces[kind].push_back(std::move(piece));
        }
      idx.order.push_back(name);
      idx.tensors.emplace(name, std::move(ct));
    }
    for (const auto& [file, f] : j.at("files").items()) {
      name_file(file);
      idx.files[file] = index_number<std::uint64_t>(f.at("bytes"), "bytes", path);
    }
  } catch (const nlohmann::json::exception& e) {
    bad_index(path, std::string("a field is missing or has the wrong type: ") + e.what());
  }
  return idx;
}

DTRAIN_DECL std::string written_text(const WrittenPieces& written) {
  nlohmann::ordered_json pieces = nlohmann::ordered_json::object();
  for (const auto& e : written.pieces) pieces[e.tensor][e.kind].push_back(piece_json(e.piece));
  nlohmann::ordered_json out = {{"pieces", pieces}};
  if (!written.file.empty()) {
    out["file"] = written.file;
    out["bytes"] = written.bytes;
  }
  return out.dump();
}

DTRAIN_DECL void merge_written(CheckpointIndex& index, std::string_view text) {
  const auto written = nlohmann::ordered_json::parse(text);
  if (!written.contains("file")) return;  // this rank wrote nothing
  index.files[written.at("file").get<std::string>()] = written.at("bytes").get<std::uint64_t>();
  for (const auto& [tensor, kinds] : written.at("pieces").items())
    for (const auto& [kind, list] : kinds.items())
      for (const auto& p : list) index.tensors.at(tensor).pieces[kind].push_back(piece_from_json(p, "<save>"));
}

DTRAIN_DECL void sort_pieces(CheckpointIndex& index) {
  for (auto& [name, t] : index.tensors)
    for (auto& [kind, list] : t.pieces) std::ranges::sort(list, {}, &CheckpointPiece::begin);
}
}  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL bool is_checkpoint(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / checkpoint_index_name)) return false;
  try {
    detail::parse_index(dir);
    return true;
  } catch (const checkpoint_error&) {
    return false;
  }
}

DTRAIN_DECL std::filesystem::path checkpoint_path(const std::filesystem::path& parent, std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return parent / name;
}

DTRAIN_DECL std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& parent) {
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

DTRAIN_DECL std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& parent) {
  auto all = list_checkpoints(parent);
  if (all.empty()) return std::nullopt;
  return all.back();
}

DTRAIN_DECL void prune_checkpoints(const std::filesystem::path& parent, int keep_last) {
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
}  // namespace dtrain

namespace dtrain {

namespace detail {

DTRAIN_DECL void clear_partial_save(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    const bool ours = (name.starts_with("shard-") && (name.ends_with(".safetensors") || name.ends_with(".tmp"))) ||
                      name == checkpoint_model_name || name == std::string(checkpoint_model_name) + ".tmp" ||
                      name == std::string(checkpoint_index_name) + ".tmp";
    if (ours) std::filesystem::remove(entry.path(), ec);
  }
}

DTRAIN_DECL auto PieceReader::bytes(const std::string& tensor, const std::string& kind, const CheckpointPiece& p)
    -> std::span<const std::byte> {
  const std::string what = "piece '" + p.key + "' (" + kind + " of " + tensor + ", elements [" +
                           std::to_string(p.begin) + ", " + std::to_string(p.begin + p.count) + ")) in " +
                           quoted_path(dir_ / p.file);
  const SafetensorsFile& f = open(p.file);
  if (!f.contains(p.key))
    throw checkpoint_error(what + " is missing from the file",
                           "the file does not belong to this checkpoint; restore it or load an older checkpoint");
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

DTRAIN_DECL auto PieceReader::open(const std::string& file) -> const SafetensorsFile& {
  if (auto it = files_.find(file); it != files_.end()) return it->second;
  const auto path = contained_path(dir_, file, "the index of checkpoint " + quoted_path(dir_));
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
}  // namespace detail
}  // namespace dtrain
DTRAIN_IMPL_END
