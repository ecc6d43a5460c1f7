#pragma once
// Every rank must build the same model: the same parameters in the same
// order, shapes, trainability and initialisation, and the same seed. Checked
// when a Trainer is made, before any memory is spent on a wrong model, with
// the first parameter that differs named on every rank.

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/comm/world.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/wire.hpp"
#include "dtrain/model/layout.hpp"

namespace dtrain {

DTRAIN_DECL void check_same_model(World& world, const ModelLayout& layout, std::uint64_t seed);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/train/model_check.ipp"
#endif
