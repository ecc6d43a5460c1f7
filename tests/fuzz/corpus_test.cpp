// Replays every input under tests/corpus/<target>/ (the fuzzers' seeds and
// every input that once made a parser crash, hang or leak) through the same
// targets the fuzz harnesses run (targets.hpp): each must be parsed or
// rejected with a dtrain::error, nothing else.
#define BOOST_TEST_MODULE fuzz_corpus
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "fuzz/targets.hpp"
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

namespace {

namespace fs = std::filesystem;

std::vector<std::string> target_names() {
  std::vector<std::string> names;
  for (const auto& t : dtrain::fuzz::targets) names.emplace_back(t.name);
  return names;
}

}  // namespace

BOOST_DATA_TEST_CASE(corpus_replays_cleanly, boost::unit_test::data::make(target_names()), name) {
  const auto* target = std::find_if(std::begin(dtrain::fuzz::targets), std::end(dtrain::fuzz::targets),
                                    [&](const auto& t) { return name == t.name; });
  const fs::path corpus = fs::path(DTRAIN_SOURCE_DIR) / "tests" / "corpus" / name;
  BOOST_REQUIRE_MESSAGE(fs::is_directory(corpus), corpus << " is missing");
  char pattern[] = "/tmp/dtrain-corpus-XXXXXX";
  BOOST_REQUIRE(::mkdtemp(pattern) != nullptr);
  const fs::path scratch = pattern;
  int replayed = 0;
  for (const auto& e : fs::directory_iterator(corpus)) {
    std::ifstream in(e.path(), std::ios::binary);
    const std::vector<unsigned char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    BOOST_TEST_CONTEXT(e.path()) { BOOST_CHECK_NO_THROW(target->run(bytes, scratch)); }
    ++replayed;
  }
  fs::remove_all(scratch);
  BOOST_TEST(replayed > 0);
}

// Every folder of tests/corpus is a target's: a corpus no target replays
// would be a regression test that never runs.
BOOST_AUTO_TEST_CASE(every_corpus_has_a_target) {
  const auto names = target_names();
  for (const auto& e : fs::directory_iterator(fs::path(DTRAIN_SOURCE_DIR) / "tests" / "corpus"))
    BOOST_TEST_CONTEXT(e.path()) { BOOST_TEST(std::ranges::count(names, e.path().filename().string()) == 1); }
}
