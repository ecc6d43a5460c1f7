// Replays every input under tests/corpus/<target>/ (the fuzzers' seeds and
// every input that once made a parser crash, hang or leak) through the same
// targets the fuzz harnesses run (targets.hpp): each must be parsed or
// rejected with a dtrain::error, nothing else.
#define BOOST_TEST_MODULE fuzz_corpus
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "fuzz/targets.hpp"

namespace {

namespace fs = std::filesystem;

template <class Target>
void replay(const std::string& name, Target target) {
  const fs::path corpus = fs::path(DTRAIN_SOURCE_DIR) / "tests" / "corpus" / name;
  BOOST_REQUIRE_MESSAGE(fs::is_directory(corpus), corpus << " is missing");
  char pattern[] = "/tmp/dtrain-corpus-XXXXXX";
  BOOST_REQUIRE(::mkdtemp(pattern) != nullptr);
  const fs::path scratch = pattern;
  int replayed = 0;
  for (const auto& e : fs::directory_iterator(corpus)) {
    std::ifstream in(e.path(), std::ios::binary);
    const std::vector<unsigned char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    BOOST_TEST_CONTEXT(e.path()) { BOOST_CHECK_NO_THROW(target(bytes, scratch)); }
    ++replayed;
  }
  fs::remove_all(scratch);
  BOOST_TEST(replayed > 0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(safetensors_corpus) { replay("safetensors", dtrain::fuzz::safetensors); }
BOOST_AUTO_TEST_CASE(checkpoint_index_corpus) { replay("checkpoint_index", dtrain::fuzz::checkpoint_index); }
BOOST_AUTO_TEST_CASE(config_corpus) { replay("config", dtrain::fuzz::config); }
