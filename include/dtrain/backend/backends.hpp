#pragma once
// The backends <dtrain/trainer.hpp> includes, one line each: a backend's
// instance list (backend/<name>/train_instances.hpp) includes the whole
// backend (its device, communicators and binding, offload copies) and
// declares what dtrain::runtime compiles for it. A new backend is its
// folder plus its line here.

#include "dtrain/backend/cuda/train_instances.hpp"
#include "dtrain/backend/host/train_instances.hpp"
