#pragma once
// Where every parameter lives in the library's flat storage.
//
// Trainable parameters of all units share one flat buffer laid out in
// REVERSE unit order (the last unit first): backward produces gradients in
// that order, so a gradient bucket is always a contiguous slice that is
// complete as soon as its units' backward ran, and one all-reduce per bucket
// covers it. Within a unit, parameters keep their declaration order. Frozen
// parameters live in a separate flat buffer: they get no gradient, no
// optimizer state and no gradient communication.
//
// Sharding: with `shards` = G > 1 every unit's segment (trainable and frozen
// alike) is padded with zeros to a multiple of G, so each of G ranks holds an
// equal shard of s = padded / G elements. Since every padded segment starts
// at a multiple of G, rank g's shard of a unit is
//   full[offset + g*s, offset + (g+1)*s)   and sits at   offset / G
// in the rank's own shard flat: all of a rank's shards form one contiguous
// buffer (one fused optimizer pass), and shard arithmetic is one division.
//
// Tied parameters (ParamSpec::tied_to) take no place in either buffer: a
// tie names the stored parameter ("owner") it shares, and is listed apart
// (ties()), so strategies, checkpoints and the optimizer see every weight
// exactly once. The Trainer hands the tied unit the owner's values and adds
// the tied unit's gradient into the owner's before the owner's gradient is
// reduced (docs/design.md, "Tied parameters").

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <stdexcept>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/model/param.hpp"

namespace dtrain {

struct ParamSlot {
  std::string name;        // "<unit index>.<param name>", e.g. "2.weight"
  std::size_t unit = 0;
  std::size_t index = 0;   // position in the unit's params()
  ParamSpec spec;
  std::size_t offset = 0;  // in the trainable or the frozen flat buffer
};

// A parameter declared with ParamSpec::tied_to: unit `unit`'s parameter
// number `index` (declaration order) is the stored parameter `owner`, the
// params[owner_position] of unit owner_unit (owner_unit <= unit).
struct TiedSlot {
  std::string name;  // "<unit>.<param>" of the tied parameter
  std::size_t unit = 0;
  std::size_t index = 0;
  std::string owner;
  std::size_t owner_unit = 0;
  std::size_t owner_position = 0;
  ParamSpec spec;  // the owner's, under the tied parameter's name
};

struct UnitSlots {
  std::vector<ParamSlot> params;   // the stored parameters, declaration order (ties left out)
  std::size_t train_offset = 0;    // this unit's segment of the trainable flat buffer
  std::size_t train_size = 0;      // its parameters' elements
  std::size_t train_padded = 0;    // train_size rounded up to a multiple of the shard count
  std::size_t frozen_offset = 0;   // the same for the frozen flat buffer
  std::size_t frozen_size = 0;
  std::size_t frozen_padded = 0;

  bool has_params() const { return train_size + frozen_size != 0; }
};

// A run of consecutive units (in backward order) whose gradients are reduced
// by one collective: the slice [offset, offset + size) of the trainable flat.
struct Bucket {
  std::size_t first_unit = 0;  // the highest unit index in the bucket (runs first in backward)
  std::size_t last_unit = 0;   // the lowest; its backward completes the bucket
  std::size_t offset = 0;
  std::size_t size = 0;
};

struct BucketOptions {
  // Like PyTorch DDP: a small first bucket so communication starts early in
  // backward, then larger ones to amortise per-collective latency.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  std::size_t bucket_bytes = std::size_t{25} << 20;
};

class ModelLayout {
 public:
  explicit ModelLayout(const std::vector<std::vector<ParamSpec>>& unit_params, std::size_t shards = 1)
      : shards_(shards) {
    if (shards < 1) throw config_error("ModelLayout: the shard count must be >= 1");
    units_.resize(unit_params.size());
    for (std::size_t u = unit_params.size(); u-- > 0;) {
      UnitSlots& slots = units_[u];
      slots.train_offset = train_total_;
      slots.frozen_offset = frozen_total_;
      for (std::size_t i = 0; i < unit_params[u].size(); ++i) {
        const ParamSpec& spec = unit_params[u][i];
        validate(spec, u);
        if (!spec.tied_to.empty()) {
          ties_.push_back({std::to_string(u) + "." + spec.name, u, i, spec.tied_to, 0, 0, spec});
          continue;
        }
        ParamSlot slot{std::to_string(u) + "." + spec.name, u, i, spec, 0};
        const auto n = static_cast<std::size_t>(spec.numel());
        std::size_t& size = spec.trainable ? slots.train_size : slots.frozen_size;
        slot.offset = (spec.trainable ? slots.train_offset : slots.frozen_offset) + size;
        size += n;
        slots.params.push_back(std::move(slot));
      }
      slots.train_padded = round_up(slots.train_size);
      slots.frozen_padded = round_up(slots.frozen_size);
      train_total_ += slots.train_padded;
      frozen_total_ += slots.frozen_padded;
      train_numel_ += slots.train_size;
      frozen_numel_ += slots.frozen_size;
    }
    std::reverse(ties_.begin(), ties_.end());  // unit order
    for (TiedSlot& t : ties_) resolve(t);
  }

  const std::vector<UnitSlots>& units() const { return units_; }
  std::size_t shards() const { return shards_; }
  // Parameter elements, without padding.
  std::size_t trainable_numel() const { return train_numel_; }
  std::size_t frozen_numel() const { return frozen_numel_; }
  // Sizes of the flat buffers, padding included (equal to the above when shards == 1).
  std::size_t trainable_flat_size() const { return train_total_; }
  std::size_t frozen_flat_size() const { return frozen_total_; }

  // One line per parameter; ranks compare these to catch mismatched models.
  std::vector<std::string> signature() const {
    std::vector<std::string> lines;
    for (const auto& u : units_)
      for (const auto& p : u.params) {
        std::string line = p.name + " [";
        for (std::size_t d = 0; d < p.spec.shape.size(); ++d) {
          if (d) line += 'x';
          line += std::to_string(p.spec.shape[d]);
        }
        line += p.spec.trainable ? "] trainable" : "] frozen";
        line += " init=" + init_text(p.spec.init);
        lines.push_back(std::move(line));
      }
    for (const auto& t : ties_) lines.push_back(t.name + " tied to " + t.owner);
    return lines;
  }

  // The tied parameters, in unit order.
  const std::vector<TiedSlot>& ties() const { return ties_; }

  // Buckets in backward order; units without trainable parameters join
  // whatever bucket is open.
  std::vector<Bucket> buckets(BucketOptions opts, std::size_t element_bytes) const {
    std::vector<Bucket> out;
    Bucket open{};
    bool has_open = false;
    for (std::size_t u = units_.size(); u-- > 0;) {
      if (!has_open) {
        open = Bucket{u, u, units_[u].train_offset, 0};
        has_open = true;
      }
      open.last_unit = u;
      open.size += units_[u].train_padded;
      const std::size_t cap = out.empty() ? opts.first_bucket_bytes : opts.bucket_bytes;
      if (open.size * element_bytes >= cap) {
        out.push_back(open);
        has_open = false;
      }
    }
    if (has_open) out.push_back(open);
    return out;
  }

 private:
  static void validate(const ParamSpec& spec, std::size_t unit) {
    if (spec.name.empty())
      throw config_error("unit " + std::to_string(unit) + " declares a parameter without a name",
                         "give every ParamSpec a name unique within its unit");
    if (spec.shape.empty())
      throw config_error("parameter " + std::to_string(unit) + "." + spec.name + " has no shape",
                         "declare a shape such as {out, in}");
    for (auto d : spec.shape)
      if (d <= 0)
        throw config_error("parameter " + std::to_string(unit) + "." + spec.name + " has a non-positive dimension " +
                               std::to_string(d),
                           "every dimension must be at least 1");
  }

  // Finds a tie's owner and checks that it can stand for the tied parameter.
  void resolve(TiedSlot& t) const {
    auto fail = [&](const std::string& why, const std::string& fix) {
      throw config_error("parameter " + t.name + " is tied to '" + t.owner + "', " + why, fix);
    };
    const std::size_t dot = t.owner.find('.');
    std::size_t owner_unit = 0;
    try {
      std::size_t used = 0;
      owner_unit = std::stoul(t.owner.substr(0, dot), &used);
      if (dot == std::string::npos || used != dot) throw std::invalid_argument("");
    } catch (const std::exception&) {
      fail("which is not a parameter name", "name the owner as \"<unit>.<param>\", e.g. \"0.weight\"");
    }
    if (owner_unit > t.unit)
      fail("a parameter of a later unit",
           "tie a parameter to one of its own or an earlier unit (the owner's forward must run first)");
    const auto& owner = units_[owner_unit].params;
    const auto it = std::find_if(owner.begin(), owner.end(), [&](const ParamSlot& p) { return p.name == t.owner; });
    if (it == owner.end()) {
      std::string have;
      for (const auto& p : owner) have += (have.empty() ? "" : ", ") + p.name;
      fail("which unit " + std::to_string(owner_unit) + " does not store (it has: " + (have.empty() ? "none" : have) + ")",
           "name a stored parameter; a tied parameter cannot own another");
    }
    if (it->spec.shape != t.spec.shape)
      fail("whose shape differs (" + shape_text(it->spec.shape) + " vs " + shape_text(t.spec.shape) + ")",
           "tie parameters of the same shape, e.g. an output head [vocab, dim] to the embedding [vocab, dim]");
    t.owner_unit = owner_unit;
    t.owner_position = static_cast<std::size_t>(it - owner.begin());
    t.spec = ParamSpec{t.spec.name, it->spec.shape, it->spec.init, it->spec.trainable, t.owner};
  }

  static std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string s;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (d) s += 'x';
      s += std::to_string(shape[d]);
    }
    return s;
  }

  std::size_t round_up(std::size_t n) const { return (n + shards_ - 1) / shards_ * shards_; }

  static std::string init_text(const Init& init) {
    static constexpr const char* kinds[] = {"zeros", "ones", "constant", "uniform", "normal"};
    return std::string(kinds[static_cast<int>(init.kind)]) + "(" + std::to_string(init.a) + "," +
           std::to_string(init.b) + ")";
  }

  std::size_t shards_;
  std::vector<UnitSlots> units_;
  std::vector<TiedSlot> ties_;
  std::size_t train_total_ = 0;
  std::size_t frozen_total_ = 0;
  std::size_t train_numel_ = 0;
  std::size_t frozen_numel_ = 0;
};

}  // namespace dtrain
