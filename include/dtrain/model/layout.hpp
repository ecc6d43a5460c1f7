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
#include <stdexcept>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/model/param.hpp"

namespace dtrain {

struct ParamSlot {
  std::string name;  // "<unit index>.<param name>", e.g. "2.weight"
  std::size_t unit = 0;
  std::size_t index = 0;  // position in the unit's params()
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
  std::vector<ParamSlot> params;  // the stored parameters, declaration order (ties left out)
  std::size_t train_offset = 0;   // this unit's segment of the trainable flat buffer
  std::size_t train_size = 0;     // its parameters' elements
  std::size_t train_padded = 0;   // train_size rounded up to a multiple of the shard count
  std::size_t frozen_offset = 0;  // the same for the frozen flat buffer
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
  DTRAIN_DECL explicit ModelLayout(const std::vector<std::vector<ParamSpec>>& unit_params, std::size_t shards = 1);

  const std::vector<UnitSlots>& units() const { return units_; }
  std::size_t shards() const { return shards_; }
  // Parameter elements, without padding.
  std::size_t trainable_numel() const { return train_numel_; }
  std::size_t frozen_numel() const { return frozen_numel_; }
  // Sizes of the flat buffers, padding included (equal to the above when shards == 1).
  std::size_t trainable_flat_size() const { return train_total_; }
  std::size_t frozen_flat_size() const { return frozen_total_; }

  // One line per parameter; ranks compare these to catch mismatched models.
  DTRAIN_DECL std::vector<std::string> signature() const;

  // The tied parameters, in unit order.
  const std::vector<TiedSlot>& ties() const { return ties_; }

  // Buckets in backward order; units without trainable parameters join
  // whatever bucket is open.
  DTRAIN_DECL std::vector<Bucket> buckets(BucketOptions opts, std::size_t element_bytes) const;

 private:
  DTRAIN_DECL static void validate(const ParamSpec& spec, std::size_t unit);

  // Finds a tie's owner and checks that it can stand for the tied parameter.
  DTRAIN_DECL void resolve(TiedSlot& t) const;

  DTRAIN_DECL static std::string shape_text(const std::vector<std::int64_t>& shape);

  std::size_t round_up(std::size_t n) const { return (n + shards_ - 1) / shards_ * shards_; }

  DTRAIN_DECL static std::string init_text(const Init& init);

  std::size_t shards_;
  std::vector<UnitSlots> units_;
  std::vector<TiedSlot> ties_;
  std::size_t train_total_ = 0;
  std::size_t frozen_total_ = 0;
  std::size_t train_numel_ = 0;
  std::size_t frozen_numel_ = 0;
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/model/layout.ipp"
#endif
