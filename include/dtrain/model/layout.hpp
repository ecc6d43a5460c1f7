#pragma once
// Where every parameter lives in the library's flat storage.
//
// Trainable parameters of all units share one flat buffer laid out in
// REVERSE unit order (the last unit first): backward produces gradients in
// that order, so a gradient bucket is always a contiguous slice that is
// complete as soon as its units' backward ran, and one all-reduce per bucket
// covers it. Within a unit, parameters keep their declaration order. Frozen
// parameters live in a separate flat buffer: they get no gradient, no
// optimizer state and no communication beyond the initial broadcast.

#include <cstddef>
#include <cstdint>
#include <string>
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

struct UnitSlots {
  std::vector<ParamSlot> params;  // declaration order
  std::size_t train_offset = 0;   // this unit's slice of the trainable flat buffer
  std::size_t train_size = 0;
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
  explicit ModelLayout(const std::vector<std::vector<ParamSpec>>& unit_params) {
    units_.resize(unit_params.size());
    for (std::size_t u = unit_params.size(); u-- > 0;) {
      UnitSlots& slots = units_[u];
      slots.train_offset = train_total_;
      for (std::size_t i = 0; i < unit_params[u].size(); ++i) {
        const ParamSpec& spec = unit_params[u][i];
        validate(spec, u);
        ParamSlot slot{std::to_string(u) + "." + spec.name, u, i, spec, 0};
        const auto n = static_cast<std::size_t>(spec.numel());
        if (spec.trainable) {
          slot.offset = train_total_;
          train_total_ += n;
          slots.train_size += n;
        } else {
          slot.offset = frozen_total_;
          frozen_total_ += n;
        }
        slots.params.push_back(std::move(slot));
      }
    }
  }

  const std::vector<UnitSlots>& units() const { return units_; }
  std::size_t trainable_numel() const { return train_total_; }
  std::size_t frozen_numel() const { return frozen_total_; }

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
        lines.push_back(std::move(line));
      }
    return lines;
  }

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
      open.size += units_[u].train_size;
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

  std::vector<UnitSlots> units_;
  std::size_t train_total_ = 0;
  std::size_t frozen_total_ = 0;
};

}  // namespace dtrain
