#pragma once
// The small MLP job the reliability tests launch: examples/mlp's train_mlp on
// the model and synthetic data every such test uses (two hidden layers of 32,
// 512 samples of 16 features in 4 classes, batches of 16, no loader workers),
// followed by the test's own keys.

#include <initializer_list>
#include <string>
#include <vector>

namespace dtrain::testing {

// `program`, `steps=`, `log_every=`, the shared keys, then `extra`.
inline std::vector<std::string> small_mlp_job(const std::string& program, int steps, int log_every,
                                              std::initializer_list<std::string> extra = {}) {
  std::vector<std::string> args{program, "steps=" + std::to_string(steps), "log_every=" + std::to_string(log_every)};
  args.insert(args.end(),
              {"hidden=32,32", "samples=512", "features=16", "classes=4", "batch_size=16", "num_workers=0"});
  args.insert(args.end(), extra);
  return args;
}

// The same job under `launcher` (dtrain-run and its flags).
inline std::vector<std::string> launched(std::vector<std::string> launcher, const std::vector<std::string>& job) {
  launcher.insert(launcher.end(), job.begin(), job.end());
  return launcher;
}

}  // namespace dtrain::testing
