#pragma once
// What pages.cpp and guide.cpp share: the check that fails doc_snippets, and
// a model over their data (32 features, labels of 4 classes out of 10).
#include <stdexcept>
#include <string>

#include <dtrain/trainer.hpp>

namespace doc {

inline void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("documented snippet check failed: ") + what);
}

struct Net {
  dtrain::nn::Linear fc1{32, 64};
  dtrain::nn::GELU act;
  dtrain::nn::Linear fc2{64, 10};
  dtrain::nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(fc1, act, fc2); }
};

}  // namespace doc
