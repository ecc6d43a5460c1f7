#pragma once
// CheckpointIO: a trainer's checkpoint and parameter I/O. Resumable
// checkpoints (save, load), consolidated and pretrained weights
// (save_params, load_params) and the parameters by name, at any world size
// and under any strategy: everything goes through the strategy's ownership
// contract (owned(), ownership(), frozen_storage(), read_unit(),
// after_load()) and the optimizer's state, so it is compiled once per
// (device, compute dtype), whatever the model and strategy.
//
// Each operation is collective: every rank calls it with the same arguments.
// A rank that fails tells the others (agree), so either every rank changes
// its state or none does, and no rank is left waiting in a collective.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/fault.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/io/crc32c.hpp"
#include "dtrain/io/safetensors.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/optim/flat_optimizer.hpp"
#include "dtrain/strategy/any_strategy.hpp"

namespace dtrain {

namespace detail {

// What ranks tell each other while saving (World::all_gather): a rank's
// failure ("" if none), and the index entries (JSON) of the files it wrote.
struct RankSave {
  std::string error, written, model;
  static constexpr auto wire_fields() {
    return std::tuple{field("error", &RankSave::error), field("written", &RankSave::written),
                      field("model", &RankSave::model)};
  }
};

struct SamplerPosition {
  std::int64_t epoch = 0, position = 0;
  static constexpr auto wire_fields() {
    return std::tuple{field("epoch", &SamplerPosition::epoch), field("position", &SamplerPosition::position)};
  }
};

}  // namespace detail

// Where a model's parameters come from when they are not one file named
// like the model: the files (opened, mapped), and for each model tensor
// ("<unit>.<param>") the file tensors whose elements, concatenated in order,
// make its elements (several for a fused projection, e.g. Llama's gate and
// up projections in one nn::Linear).
struct ParamSources {
  std::string what;  // for messages: the file or directory, quoted
  std::vector<SafetensorsFile> files;
  std::map<std::string, std::vector<std::pair<std::size_t, std::string>>> parts;  // model name -> (file, tensor)...
  // Model tensors [rows, cols] whose one file tensor is stored transposed,
  // [cols, rows] (GPT-2's Conv1D weights).
  std::set<std::string> transposed;
  // File tensors that are not parameters (buffers, a tied head's copy):
  // neither loaded nor reported as unexpected.
  std::set<std::string> ignored;

  // "" when the parts make a tensor of `shape` in a float dtype; otherwise
  // what differs, for the report.
  std::string mismatch(const std::vector<std::pair<std::size_t, std::string>>& of,
                       const std::vector<std::int64_t>& shape, bool transposed_shape = false) const {
    std::int64_t rows = 0;
    std::string have;
    bool ok = !shape.empty() || of.size() == 1;
    for (const auto& [f, name] : of) {
      const auto t = files[f].tensor(name);
      have += (have.empty() ? "" : " + ") + shape_text(t.shape) + " " + std::string(safetensors_name(t.dtype));
      const bool floating =
          t.dtype == element_type::f32 || t.dtype == element_type::bf16 || t.dtype == element_type::f16;
      if (!floating) ok = false;
      if (of.size() == 1 && transposed_shape) {
        ok = ok && t.shape.size() == 2 && shape.size() == 2 && t.shape[0] == shape[1] && t.shape[1] == shape[0];
      } else if (of.size() == 1) {
        ok = ok && t.shape == shape;
      } else if (ok) {  // concatenated along the first dimension
        ok = t.shape.size() == shape.size() && std::equal(t.shape.begin() + 1, t.shape.end(), shape.begin() + 1);
        rows += t.shape.empty() ? 0 : t.shape[0];
      }
    }
    if (of.size() > 1) ok = ok && rows == shape[0];
    return ok ? ""
              : have + " in the file" + (of.size() > 1 ? "s" : "") + ", " + shape_text(shape) +
                    (transposed_shape ? " (stored transposed)" : "") + " in the model";
  }
};

template <class Dev, class T>
class CheckpointIO {
 public:
  // `optimizer_state` gives the optimizer's state buffers, laid out like the
  // strategy's owned flat (on the host when owned().on_host says so).
  CheckpointIO(World& world, Dev& dev, const ModelLayout& layout, AnyStrategy<T>& strategy,
               std::function<std::vector<OptimizerStateView>()> optimizer_state)
      : world_(world), dev_(dev), layout_(layout), strategy_(strategy), optimizer_state_(std::move(optimizer_state)) {}

  // Every parameter as fp32 on the host, by name ("<unit>.<param>").
  // Collective under sharded strategies: every rank must call it.
  std::map<std::string, std::vector<float>> parameters();

  // Calls f(slot, values) for every parameter in layout order, as fp32 on the
  // host, one unit gathered at a time (so no rank holds the whole model).
  // Collective: every rank calls it, and every rank's f sees every tensor.
  template <class F>
  void visit_parameters(F&& f) {
    for (std::size_t u = 0; u < layout_.units().size(); ++u) {
      const auto& unit = layout_.units()[u];
      std::vector<float> train(unit.train_size);
      std::vector<T> frozen(unit.frozen_size);
      strategy_.read_unit(u, train, frozen);
      for (const auto& slot : unit.params) {
        const auto n = static_cast<std::size_t>(slot.spec.numel());
        std::vector<float> v(n);
        if (slot.spec.trainable) {
          std::copy_n(train.begin() + static_cast<std::ptrdiff_t>(slot.offset - unit.train_offset), n, v.begin());
        } else {
          const auto at = static_cast<std::ptrdiff_t>(slot.offset - unit.frozen_offset);
          for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(frozen[static_cast<std::size_t>(at) + i]);
        }
        f(slot, std::move(v));
      }
    }
  }

  // Every parameter as F32 in one safetensors file (atomically), the names
  // "<unit>.<param>" and the units' shapes: rank 0 streams it to disk while
  // the units are gathered one by one, so no rank holds the whole model.
  // Collective: every rank calls it; the file exists on every rank's return.
  void save_params(const std::filesystem::path& path);

  // Writes a resumable checkpoint to `dir` (a new directory, or one a save
  // that died left without an index): every rank writes what it owns, rank 0
  // commits the index last. Collective: every rank calls it with the same
  // dir. A directory that holds a checkpoint is never overwritten.
  // `info` is the trainer's non-tensor state (step, loss scale, dtypes, ...).
  void save(const std::filesystem::path& dir, const SaveOptions& options, CheckpointInfo info);

  // Restores a checkpoint saved by any strategy at any world size: checks
  // that it was made for this model (naming the first tensor that differs)
  // before touching anything, reads and verifies what this rank owns, and
  // only then replaces parameters, optimizer state, step and loss scale.
  // Collective. Returns the checkpoint's non-tensor state for the trainer to
  // take (step, loss scale); restore the sampler with
  // info.sampler->state_for(sampler).
  CheckpointInfo load(const std::filesystem::path& dir, const LoadOptions& options = {});

  // Parameters from a safetensors file (F32, BF16 or F16 tensors named
  // "<unit>.<param>", or renamed through options.rename), at any world size
  // and strategy: every rank reads only the elements it owns. Optimizer
  // state and step are left alone. Collective.
  LoadParamsReport load_params(const std::filesystem::path& file, const LoadParamsOptions& options = {});

  // Parameters from tensors spread over several files, a model tensor made
  // of one or more file tensors (ParamSources). The same guarantees.
  LoadParamsReport load_params(const ParamSources& sources, const LoadParamsOptions& options = {});

 private:
  static std::string join(const std::vector<std::string>& v);

  // Host buffers shaped like this rank's owned state, holding a copy of it
  // (or left unfilled when the caller overwrites every element); without
  // the optimizer state when the caller neither reads nor replaces it.
  HostState<T> host_state(bool copy = true, bool optimizer_state = true);

  void put_host_state(const HostState<T>& s, bool optimizer_state);

  // Throws on every rank when `error` (this rank's) or any other rank's is set.
  void agree(const std::string& error, const std::string& what);
  // Every parameter in F32 to `path`, gathered unit by unit; rank 0 streams
  // the file and returns its pieces as written_text (for a checkpoint's
  // index; empty when it failed). Every rank
  // takes part in every gather, even after rank 0 failed (`error` then holds
  // why), so no rank is left waiting in a collective.
  std::string stream_parameters(const std::filesystem::path& path, std::string& error);

  // Rank 0: merges every rank's pieces into the index and commits it.
  void commit_index(const std::filesystem::path& dir, const CheckpointInfo& info,
                    const std::vector<detail::RankSave>& ranks);

  // The checkpoint must hold exactly this model's tensors, in this order,
  // with the same shapes and trainability; the first difference is named.
  void check_checkpoint_model(const CheckpointIndex& index) const;

  // Fills `state` with what this rank owns, from the checkpoint's pieces.
  void read_owned(const CheckpointIndex& index, HostState<T>& state, bool optimizer_state);

  World& world_;
  Dev& dev_;
  const ModelLayout& layout_;
  // Owned state (master weights, optimizer state) into host memory, from
  // the compute device or, offloaded, from the host.
  void copy_owned(float* dst, const float* src, std::size_t n, bool on_host);

  AnyStrategy<T>& strategy_;
  std::function<std::vector<OptimizerStateView>()> optimizer_state_;
};

template <class Dev, class T>
auto CheckpointIO<Dev, T>::parameters() -> std::map<std::string, std::vector<float>> {
  std::map<std::string, std::vector<float>> out;
  visit_parameters([&](const ParamSlot& slot, std::vector<float>&& v) { out.emplace(slot.name, std::move(v)); });
  return out;
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::save_params(const std::filesystem::path& path) -> void {
  std::string error;
  stream_parameters(path, error);
  agree(error, "could not write " + detail::quoted_path(path));
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::save(const std::filesystem::path& dir, const SaveOptions& options, CheckpointInfo info)
    -> void {
  if (is_checkpoint(dir))
    throw checkpoint_error(detail::quoted_path(dir) + " already holds a checkpoint (step " +
                               std::to_string(checkpoint_info(dir).step) + ")",
                           "save to a new directory (train_mlp uses <checkpoint_dir>/step-<n>), or remove it "
                           "first: dtrain never overwrites a complete checkpoint");
  info.metadata = options.metadata;
  if (options.sampler) {
    info.sampler = SamplerProgress::of(*options.sampler);
    world_.agree("the sampler position saved in " + dir.string(),
                 detail::SamplerPosition{info.sampler->epoch, info.sampler->global_position});
  }
  if (world_.rank() == 0) {
    std::filesystem::create_directories(dir);
    detail::clear_partial_save(dir);
  }
  world_.barrier("checkpoint-dir");
  std::string error;
  std::size_t bytes = 0;  // what this rank writes
  detail::RankSave mine;
  try {
    const Ownership own = strategy_.ownership();
    const bool writes =
        std::ranges::any_of(own.trainable, &OwnedRange::writer) || std::ranges::any_of(own.frozen, &OwnedRange::writer);
    HostState<T> state = writes ? host_state() : HostState<T>{};
    // A checkpoint never holds inf or NaN: resuming from it would only
    // reproduce the failure (and keep_last could have pruned the good ones).
    detail::require_finite(state, own, layout_);
    bytes = state.bytes();
    mine.written = detail::write_rank_file(dir, world_.rank(), world_.size(), layout_, own, std::move(state),
                                           options.consolidated);
  } catch (const dtrain::error& e) {
    error = e.problem() + detail::space_note(dir, bytes);  // the fix below covers the write's own
  } catch (const std::exception& e) {
    error = e.what() + detail::space_note(dir, bytes);
  }
  fault::hit(fault::point::save);
  if (options.consolidated) mine.model = stream_parameters(dir / checkpoint_model_name, error);
  mine.error = error;
  const std::vector<detail::RankSave> ranks = world_.all_gather("checkpoint-files", mine);
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (const std::string& e = ranks[r].error; !e.empty()) {
      // Every rank is done with the directory: the partial save goes, so a
      // full disk is not left fuller; the previous checkpoint is untouched.
      world_.barrier("checkpoint-failed");
      if (world_.rank() == 0) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
      throw checkpoint_error("rank " + std::to_string(r) + " could not write its part of checkpoint " +
                                 detail::quoted_path(dir) + ": " + e,
                             "check free disk space and permissions on every rank (all ranks write to the same "
                             "directory: a shared file system across nodes); the partial files were removed and "
                             "the previous checkpoint is untouched");
    }
  std::string committed;
  if (world_.rank() == 0) {
    try {
      commit_index(dir, info, ranks);
    } catch (const std::exception& e) {
      committed = e.what();
    }
  }
  const auto status = world_.all_gather("checkpoint-commit", committed);
  if (!status[0].empty())
    throw checkpoint_error("rank 0 could not commit checkpoint " + detail::quoted_path(dir) + ": " + status[0],
                           "check free disk space and permissions; the previous checkpoint is untouched");
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::load(const std::filesystem::path& dir, const LoadOptions& options) -> CheckpointInfo {
  const CheckpointIndex index = detail::parse_index(dir);
  check_checkpoint_model(index);
  const auto states = optimizer_state_();
  std::vector<std::string> names;
  for (const auto& st : states) names.emplace_back(st.name);
  if (options.optimizer_state && index.info.optimizer_states != names)
    throw config_error("checkpoint " + detail::quoted_path(dir) + " holds " + index.info.optimizer + " state (" +
                           join(index.info.optimizer_states) + ") but this trainer's optimizer keeps (" + join(names) +
                           ")",
                       "train with the checkpoint's optimizer, or load with LoadOptions{.optimizer_state = false} "
                       "to keep this trainer's fresh optimizer state");
  // Every owned element is read from the checkpoint: sized buffers, not a copy of the current state.
  HostState<T> state = host_state(false, options.optimizer_state);
  std::string error;
  try {
    read_owned(index, state, options.optimizer_state);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(error, "could not load checkpoint " + detail::quoted_path(dir));
  put_host_state(state, options.optimizer_state);
  return index.info;
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::load_params(const std::filesystem::path& file, const LoadParamsOptions& options)
    -> LoadParamsReport {
  ParamSources sources;
  sources.what = detail::quoted_path(file);
  sources.files.push_back(SafetensorsFile::open(file));
  for (const auto& name : sources.files[0].names()) {
    const auto it = options.rename.find(name);
    sources.parts[it == options.rename.end() ? name : it->second] = {{0, name}};
  }
  return load_params(sources, options);
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::load_params(const ParamSources& sources, const LoadParamsOptions& options)
    -> LoadParamsReport {
  LoadParamsReport report;
  std::map<std::pair<std::size_t, std::string>, bool> used;
  const auto tagged = [&](const ParamSlot& slot, const std::vector<std::string>& tags) {
    for (const auto& t : tags)
      if (std::find(slot.spec.tags.begin(), slot.spec.tags.end(), t) != slot.spec.tags.end()) return true;
    return false;
  };
  for (const auto& unit : layout_.units())
    for (const auto& slot : unit.params) {
      const bool only = !options.only_tags.empty() || !options.only_names.empty();
      const bool named =
          std::find(options.only_names.begin(), options.only_names.end(), slot.name) != options.only_names.end();
      if (tagged(slot, options.skip_tags) || (only && !tagged(slot, options.only_tags) && !named)) continue;
      const auto it = sources.parts.find(slot.name);
      if (it == sources.parts.end()) {
        report.missing.push_back(slot.name);
        continue;
      }
      for (const auto& part : it->second) used[part] = true;
      if (const std::string why = sources.mismatch(it->second, slot.spec.shape, sources.transposed.contains(slot.name));
          !why.empty())
        report.mismatched.push_back(slot.name + ": " + why);
      else
        report.loaded.push_back(slot.name);
    }
  for (std::size_t f = 0; f < sources.files.size(); ++f)
    for (const auto& name : sources.files[f].names())
      if (!used.contains({f, name}) && !sources.ignored.contains(name)) report.unexpected.push_back(name);
  if (options.strict && (!report.missing.empty() || !report.unexpected.empty() || !report.mismatched.empty()))
    throw config_error(sources.what + " does not match this model:" +
                           (report.missing.empty() ? "" : " missing " + join(report.missing) + ";") +
                           (report.unexpected.empty() ? "" : " unexpected " + join(report.unexpected) + ";") +
                           (report.mismatched.empty() ? "" : " mis-shaped " + join(report.mismatched) + ";"),
                       "map the file's names with LoadParamsOptions::rename, or load what matches with "
                       "strict = false (train_mlp: init_strict=false)");
  // Parameters only: the optimizer state is left as it is, so no copy of it.
  HostState<T> state = host_state(true, false);
  std::string error;
  try {
    const std::map<std::string, bool> wanted = [&] {
      std::map<std::string, bool> m;
      for (const auto& n : report.loaded) m[n] = true;
      return m;
    }();
    const Ownership own = strategy_.ownership();
    for (bool frozen : {false, true})
      for (const auto& p : detail::owned_pieces(layout_, frozen ? own.frozen : own.trainable, frozen, false)) {
        if (!wanted.contains(p.slot->name)) continue;
        T* to_frozen = frozen ? state.frozen.data() + p.local : nullptr;
        float* to_master = frozen ? nullptr : state.master.data() + p.local;
        // The piece [tensor_begin, + count) of the model tensor, from the
        // file tensors that cover it, in order.
        std::size_t at = 0;
        std::vector<std::byte> gathered;  // a transposed piece, element by element in model order
        for (const auto& [f, name] : sources.parts.at(p.slot->name)) {
          const auto t = sources.files[f].tensor(name);
          const std::size_t elem = element_bytes(t.dtype), n = t.bytes.size() / elem;
          const std::size_t lo = std::max(at, p.tensor_begin), hi = std::min(at + n, p.tensor_begin + p.count);
          if (lo < hi) {
            std::span<const std::byte> bytes = t.bytes.subspan((lo - at) * elem, (hi - lo) * elem);
            if (sources.transposed.contains(p.slot->name)) {
              // Model element e = r * cols + c is file element c * rows + r.
              const auto rows = static_cast<std::size_t>(p.slot->spec.shape[0]), cols = n / rows;
              gathered.resize((hi - lo) * elem);
              for (std::size_t e = lo; e < hi; ++e)
                std::memcpy(gathered.data() + (e - lo) * elem, t.bytes.data() + ((e % cols) * rows + e / cols) * elem,
                            elem);
              bytes = gathered;
            }
            const std::string what = "tensor '" + name + "' of " + detail::quoted_path(sources.files[f].path());
            if (frozen)
              detail::convert_into(bytes, t.dtype, to_frozen + (lo - p.tensor_begin), hi - lo, what);
            else
              detail::convert_into(bytes, t.dtype, to_master + (lo - p.tensor_begin), hi - lo, what);
          }
          at += n;
        }
      }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(error, "could not load parameters from " + sources.what);
  put_host_state(state, false);
  return report;
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::join(const std::vector<std::string>& v) -> std::string {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out.empty() ? "none" : out;
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::host_state(bool copy, bool optimizer_state) -> HostState<T> {
  HostState<T> s;
  const OwnedFlat<T> owned = strategy_.owned();
  s.master.resize(owned.size);
  if (copy) copy_owned(s.master.data(), owned.master, owned.size, owned.on_host);
  if (optimizer_state)
    for (const auto& st : optimizer_state_()) {
      auto& [name, values] = s.optimizer.emplace_back(std::string(st.name), std::vector<float>(owned.size));
      if (copy) copy_owned(values.data(), st.data, owned.size, owned.on_host);
    }
  const std::span<T> frozen = strategy_.frozen_storage();
  s.frozen.resize(frozen.size());
  if (copy) dev_.copy_to_host(s.frozen.data(), frozen.data(), frozen.size());
  return s;
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::put_host_state(const HostState<T>& s, bool optimizer_state) -> void {
  const OwnedFlat<T> owned = strategy_.owned();
  if (owned.on_host)
    std::copy_n(s.master.data(), owned.size, owned.master);
  else
    dev_.copy_from_host(owned.master, s.master.data(), owned.size);
  if (optimizer_state) {
    const auto states = optimizer_state_();
    for (std::size_t i = 0; i < states.size(); ++i) {
      if (owned.on_host)
        std::copy_n(s.optimizer[i].second.data(), owned.size, states[i].data);
      else
        dev_.copy_from_host(states[i].data, s.optimizer[i].second.data(), owned.size);
    }
  }
  const std::span<T> frozen = strategy_.frozen_storage();
  dev_.copy_from_host(frozen.data(), s.frozen.data(), frozen.size());
  strategy_.after_load();
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::agree(const std::string& error, const std::string& what) -> void {
  const auto all = world_.all_gather("checkpoint-agree", error);
  for (int r = 0; r < world_.size(); ++r)
    if (!all[static_cast<std::size_t>(r)].empty())
      throw checkpoint_error("rank " + std::to_string(r) + " " + what + ": " + all[static_cast<std::size_t>(r)],
                             "nothing was changed; fix the cause named above (or load an older checkpoint)");
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::stream_parameters(const std::filesystem::path& path, std::string& error) -> std::string {
  std::optional<SafetensorsStreamWriter> out;
  if (world_.rank() == 0 && error.empty()) {
    std::vector<SafetensorsEntry> entries;
    for (const auto& unit : layout_.units())
      for (const auto& slot : unit.params) entries.push_back({slot.name, element_type::f32, slot.spec.shape});
    try {
      out.emplace(path, std::move(entries));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  detail::WrittenPieces written;
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const auto& unit = layout_.units()[u];
    std::vector<float> train(unit.train_size);
    std::vector<T> frozen(unit.frozen_size);
    strategy_.read_unit(u, train, frozen);
    if (!out || !error.empty()) continue;
    try {
      std::vector<float> widened;  // a frozen parameter in fp32
      for (const auto& slot : unit.params) {
        const auto n = static_cast<std::size_t>(slot.spec.numel());
        std::span<const float> v;
        if (slot.spec.trainable) {
          v = std::span(train).subspan(slot.offset - unit.train_offset, n);
        } else {
          widened.resize(n);
          for (std::size_t i = 0; i < n; ++i)
            widened[i] = static_cast<float>(frozen[slot.offset - unit.frozen_offset + i]);
          v = widened;
        }
        const auto bytes = std::as_bytes(v);
        out->write(bytes);
        written.pieces.push_back(
            {slot.name, "param", {path.filename().string(), slot.name, 0, n, element_type::f32, crc32c(bytes)}});
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!out || !error.empty()) return {};
  try {
    out->commit();
    written.file = path.filename().string();
    written.bytes = std::filesystem::file_size(path);
    return detail::written_text(written);
  } catch (const std::exception& e) {
    error = e.what();
    return {};
  }
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::commit_index(const std::filesystem::path& dir, const CheckpointInfo& info,
                                        const std::vector<detail::RankSave>& ranks) -> void {
  CheckpointIndex index;
  index.info = info;
  for (const auto& unit : layout_.units())
    for (const auto& slot : unit.params) {
      index.order.push_back(slot.name);
      index.tensors[slot.name] = {slot.spec.shape, slot.spec.trainable, {}};
    }
  for (const auto& r : ranks)
    for (const std::string* part : {&r.written, &r.model})
      if (!part->empty()) detail::merge_written(index, *part);
  detail::sort_pieces(index);
  const std::string text = detail::index_text(index);
  detail::write_file_atomically(dir / checkpoint_index_name,
                                std::array{std::as_bytes(std::span(text.data(), text.size()))});
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::check_checkpoint_model(const CheckpointIndex& index) const -> void {
  std::vector<const ParamSlot*> mine;
  for (const auto& unit : layout_.units())
    for (const auto& slot : unit.params) mine.push_back(&slot);
  const std::string where = "checkpoint " + detail::quoted_path(index.info.dir) + " was saved for a different model: ";
  const char* fix =
      "load it into the model it was saved from (same config and code), or take only matching "
      "weights with load_params from a consolidated model.safetensors";
  for (std::size_t i = 0; i < std::max(mine.size(), index.order.size()); ++i) {
    if (i >= mine.size())
      throw config_error(where + "it has tensor '" + index.order[i] + "' that this model lacks", fix);
    const ParamSlot& slot = *mine[i];
    if (i >= index.order.size() || index.order[i] != slot.name)
      throw config_error(
          where + "this model's tensor '" + slot.name + "' " +
              (index.tensors.contains(slot.name)
                   ? "is at another position in it"
                   : "is not in it" +
                         std::string(i < index.order.size() ? " (it has '" + index.order[i] + "' there)" : "")),
          fix);
    const CheckpointTensor& t = index.tensors.at(slot.name);
    if (t.shape != slot.spec.shape)
      throw config_error(where + "tensor '" + slot.name + "' is " + shape_text(t.shape) + " in the checkpoint and " +
                             shape_text(slot.spec.shape) + " in this model",
                         fix);
    if (t.trainable != slot.spec.trainable)
      throw config_error(where + "tensor '" + slot.name + "' is " + (t.trainable ? "trainable" : "frozen") +
                             " in the checkpoint and " + (slot.spec.trainable ? "trainable" : "frozen") +
                             " in this model",
                         fix);
    for (const auto& [kind, list] : t.pieces)
      for (const auto& p : list)
        if (p.dtype != element_type::f32 && p.dtype != element_type::bf16 && p.dtype != element_type::f16)
          throw config_error(
              where + "tensor '" + slot.name + "' has " + kind + " of dtype " + std::string(safetensors_name(p.dtype)),
              fix);
  }
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::read_owned(const CheckpointIndex& index, HostState<T>& state, bool optimizer_state) -> void {
  detail::PieceReader reader(index.info.dir, index.files);
  const Ownership own = strategy_.ownership();
  auto pieces_of = [&](const std::string& tensor, const std::string& kind) -> const std::vector<CheckpointPiece>& {
    static const std::vector<CheckpointPiece> none;
    const auto& t = index.tensors.at(tensor);
    const auto it = t.pieces.find(kind);
    return it == t.pieces.end() ? none : it->second;
  };
  for (const auto& p : detail::owned_pieces(layout_, own.trainable, false, false)) {
    const std::string& name = p.slot->name;
    detail::read_elements(reader, name, "param", pieces_of(name, "param"), p.tensor_begin, p.count,
                          state.master.data() + p.local);
    if (optimizer_state)
      for (auto& [kind, values] : state.optimizer)
        detail::read_elements(reader, name, kind, pieces_of(name, kind), p.tensor_begin, p.count,
                              values.data() + p.local);
  }
  for (const auto& p : detail::owned_pieces(layout_, own.frozen, true, false))
    detail::read_elements(reader, p.slot->name, "param", pieces_of(p.slot->name, "param"), p.tensor_begin, p.count,
                          state.frozen.data() + p.local);
}

template <class Dev, class T>
auto CheckpointIO<Dev, T>::copy_owned(float* dst, const float* src, std::size_t n, bool on_host) -> void {
  if (on_host)
    std::copy_n(src, n, dst);
  else
    dev_.copy_to_host(dst, src, n);
}

// The built-in instances a backend compiles once (train/builtin_templates.hpp
// gathers the lists, backend/<name>/train_instances.hpp applies them).
#define DTRAIN_CHECKPOINT_IO_TEMPLATES(X, Dev, T) X(class CheckpointIO<Dev, T>)

}  // namespace dtrain
