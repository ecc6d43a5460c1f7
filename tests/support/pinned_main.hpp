#pragma once
// The main of a test that compares against a pinned Python set
// (dtrain_uses_python_env, support/python_venv.hpp): its cases run when the
// set is installed; when it is not (its fixture was skipped), the test
// reports skipped (exit 77) with the reason: before any case when every case
// needs the set, after the others when some run without it, so that a case
// left out never passes silently. The test file defines BOOST_TEST_NO_MAIN
// and BOOST_TEST_ALTERNATIVE_INIT_API before including Boost.Test.
#include <cstdio>
#include <string>

#include "support/python_venv.hpp"
#include <boost/test/unit_test.hpp>

namespace dtrain::testing {

inline bool no_test_init() { return true; }

// Every case needs the pinned set `set`.
inline int main_needing_set(const std::string& set, int argc, char* argv[]) {
  if (const std::string why = pinned_python_missing(set); !why.empty()) {
    std::printf("%s: test skipped (exit 77)\n", why.c_str());
    return 77;
  }
  return boost::unit_test::unit_test_main(&no_test_init, argc, argv);
}

// Some cases run without what `missing` says is missing ("" when nothing
// is): they run, then the test reports skipped with the reason.
inline int main_skipped_after(const std::string& missing, int argc, char* argv[]) {
  const int status = boost::unit_test::unit_test_main(&no_test_init, argc, argv);
  if (status == 0 && !missing.empty()) {
    std::printf("%s: its cases were not run: test skipped (exit 77)\n", missing.c_str());
    return 77;
  }
  return status;
}

// A test over transformers 4 (the tests/hf venv: `four` when installed) and
// 5 (the pinned torch2 set: `five`): skipped at once without either, after
// the cases it could run without one of them.
inline int main_over_transformers(bool four, bool five, int argc, char* argv[]) {
  if (!four && !five) {
    std::printf("neither transformers 4 nor 5 is available: test skipped (exit 77)\n");
    return 77;
  }
  return main_skipped_after(
      four && five ? ""
                   : (four ? pinned_python_missing("torch2") : "transformers 4 (the tests/hf venv) is not installed"),
      argc, argv);
}

}  // namespace dtrain::testing
