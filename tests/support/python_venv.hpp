#pragma once
// A Python venv for tests that read dtrain's files with a PyPI package
// (safetensors, tensorboard): Debian's /usr/bin/python3 with its system
// packages visible (torch, numpy), the package installed with pip on first
// use and kept for later runs.
#include <sys/wait.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace dtrain::testing {

// The Python that holds PyTorch and numpy for the tests: $DTRAIN_PYTHON, else
// Debian's /usr/bin/python3 (python3-torch). Another python3 may come first on
// PATH (pyenv here; on the GPU machine, the image's venv, which
// scripts/gpu_check.sh names in DTRAIN_PYTHON).
inline std::string test_python() {
  const char* chosen = std::getenv("DTRAIN_PYTHON");
  return chosen != nullptr && *chosen != '\0' ? chosen : "/usr/bin/python3";
}

// "" when `venv` can import `module`, creating the venv and pip-installing
// `package` if needed (pip gets `timeout_s`); otherwise why not, for the
// test to print before it exits 77 (skipped).
inline std::string python_venv_with(const std::filesystem::path& venv, const std::string& module,
                                    const std::string& package, int timeout_s) {
  auto shell = [](const std::string& cmd) {
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  };
  if (!std::filesystem::exists(venv / "bin/python") &&
      shell("/usr/bin/python3 -m venv --system-site-packages " + venv.string() + " > /dev/null") != 0)
    return "cannot create a Python venv (python3-venv)";
  if (shell((venv / "bin/python").string() + " -c 'import " + module + "' 2> /dev/null") != 0 &&
      shell("timeout " + std::to_string(timeout_s) + " " + (venv / "bin/pip").string() + " install -q " + package +
            " > /dev/null 2>&1") != 0)
    return "pip could not install " + package + " (is PyPI reachable?)";
  return "";
}

namespace detail {
inline std::string pinned_python_variable(const std::string& set) {
  std::string var = "DTRAIN_PYTHON_";
  for (char c : set) var += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return var;
}
}  // namespace detail

// The python of the pinned set `set` (scripts/python/SET.txt): CTest names it
// in DTRAIN_PYTHON_<SET> for the tests registered with
// dtrain_uses_python_env. Outside CTest the variable must be set by hand;
// without it this throws, naming the command that makes one.
inline std::string pinned_python(const std::string& set) {
  const std::string var = detail::pinned_python_variable(set);
  const char* chosen = std::getenv(var.c_str());
  if (chosen == nullptr || *chosen == '\0')
    throw std::runtime_error(var +
                             " is not set: run this test under ctest, or make the venv with `scripts/python_env.sh " +
                             set + " DIR` and set " + var + "=DIR/bin/python");
  return chosen;
}

// "" when the pinned set's python is there, installed whole (the fixture
// python_env_SET stamps the venv last); otherwise why not, with the reason the
// fixture recorded in VENV.skipped, for a test's main to print before it
// exits 77 (skipped too).
inline std::string pinned_python_missing(const std::string& set) {
  const std::filesystem::path python = pinned_python(set);
  const std::filesystem::path venv = python.parent_path().parent_path();
  if (std::filesystem::exists(python) && std::filesystem::exists(venv / ".dtrain-set")) return "";
  std::string why = "the pinned Python set '" + set + "' is not installed in " + venv.string() +
                    " (see the output of the CTest python_env_" + set + ")";
  std::ifstream reason(venv.string() + ".skipped");
  std::string line;
  while (std::getline(reason, line)) why += "\n  " + line;
  return why;
}

}  // namespace dtrain::testing
