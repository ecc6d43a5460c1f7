// The definitions layout.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/model/layout.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL auto ModelLayout::signature() const->std::vector<std::string> {
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

  DTRAIN_DECL auto ModelLayout::buckets(BucketOptions opts, std::size_t element_bytes) const->std::vector<Bucket> {
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

  DTRAIN_DECL auto ModelLayout::validate(const ParamSpec& spec, std::size_t unit)->void {
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

  DTRAIN_DECL auto ModelLayout::resolve(TiedSlot & t) const->void {
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
      fail("which unit " + std::to_string(owner_unit) + " does not store (it has: " + (have.empty() ? "none" : have) +
               ")",
           "name a stored parameter; a tied parameter cannot own another");
    }
    if (it->spec.shape != t.spec.shape)
      fail("whose shape differs (" + shape_text(it->spec.shape) + " vs " + shape_text(t.spec.shape) + ")",
           "tie parameters of the same shape, e.g. an output head [vocab, dim] to the embedding [vocab, dim]");
    t.owner_unit = owner_unit;
    t.owner_position = static_cast<std::size_t>(it - owner.begin());
    t.spec = ParamSpec{t.spec.name, it->spec.shape, it->spec.init, it->spec.trainable, t.owner};
  }

  DTRAIN_DECL auto ModelLayout::shape_text(const std::vector<std::int64_t>& shape)->std::string {
    std::string s;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (d) s += 'x';
      s += std::to_string(shape[d]);
    }
    return s;
  }

  DTRAIN_DECL auto ModelLayout::init_text(const Init& init)->std::string {
    static constexpr const char* kinds[] = {"zeros", "ones", "constant", "uniform", "normal", "given"};
    if (init.kind == init_kind::given) return "given(" + std::to_string(init.values_hash) + ")";
    return std::string(kinds[static_cast<int>(init.kind)]) + "(" + std::to_string(init.a) + "," +
           std::to_string(init.b) + ")";
  }
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL ModelLayout::ModelLayout(const std::vector<std::vector<ParamSpec>>& unit_params, std::size_t shards)
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
}  // namespace dtrain
DTRAIN_IMPL_END
