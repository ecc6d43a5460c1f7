// Preference pairs (data/preference.hpp): the .jsonl reader's pairs and
// refusals, and preference_batch's layout (chosen rows first, the loss only
// on the completion, right padding, the reference log-probabilities).
#include "dtrain/data/preference.hpp"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

namespace fs = std::filesystem;

namespace {

fs::path write_lines(const std::string& name, const std::vector<std::string>& lines) {
  const fs::path p = fs::temp_directory_path() / ("dtrain_preference_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream out(p);
  for (const auto& l : lines) out << l << '\n';
  return p;
}

// The config_error's text for `lines`, or "" when they are accepted.
std::string refusal(const std::vector<std::string>& lines, std::int64_t block = 8, std::int64_t vocab = 50) {
  const fs::path p = write_lines("bad.jsonl", lines);
  try {
    (void)dtrain::read_preference_pairs(p, block, vocab);
  } catch (const dtrain::config_error& e) {
    fs::remove(p);
    return e.what();
  }
  fs::remove(p);
  return "";
}

std::vector<std::int32_t> ints(const dtrain::HostTensor& t) {
  const auto v = t.values<std::int32_t>();
  return {v.begin(), v.end()};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(preference_data)

BOOST_AUTO_TEST_CASE(reads_pairs_and_lays_out_trls_batch) {
  const fs::path p =
      write_lines("pairs.jsonl", {R"({"prompt_ids": [5, 6], "chosen_ids": [7, 8, 9], "rejected_ids": [10]})", "",
                                  R"({"prompt_ids": [11], "chosen_ids": [12], "rejected_ids": [13, 14]})"});
  const std::vector<dtrain::PreferencePair> pairs = dtrain::read_preference_pairs(p, 8, 50);
  fs::remove(p);
  BOOST_TEST_REQUIRE(pairs.size() == 2u);
  BOOST_TEST(pairs[0].chosen == (std::vector<std::int32_t>{7, 8, 9}), boost::test_tools::per_element());
  BOOST_TEST(!pairs[1].ref_chosen.has_value());

  const dtrain::Batch b = dtrain::preference_batch(pairs, 0);
  // longest: prompt 2 + chosen 3 = 5 tokens, 4 positions; rows: c0 c1 r0 r1
  BOOST_TEST(b.at("x").shape == (std::vector<std::int64_t>{4, 4}), boost::test_tools::per_element());
  const std::vector<std::int32_t> x{5, 6, 7, 8, 11, 0, 0, 0, 5, 6, 0, 0, 11, 13, 0, 0};
  const std::vector<std::int32_t> y{-100, 7, 8, 9, 12, -100, -100, -100, -100, 10, -100, -100, 13, 14, -100, -100};
  BOOST_TEST(ints(b.at("x")) == x, boost::test_tools::per_element());
  BOOST_TEST(ints(b.at("y")) == y, boost::test_tools::per_element());
  BOOST_TEST(!b.contains("ref_logps"));
}

BOOST_AUTO_TEST_CASE(precomputed_reference_goes_into_the_batch) {
  const fs::path p = write_lines(
      "refs.jsonl",
      {R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3], "ref_chosen_logps": -1.5, "ref_rejected_logps": -2.25})",
       R"({"prompt_ids": [4], "chosen_ids": [5], "rejected_ids": [6], "ref_chosen_logps": -3, "ref_rejected_logps": -4.5})"});
  const auto pairs = dtrain::read_preference_pairs(p, 4, 10);
  fs::remove(p);
  const dtrain::Batch b = dtrain::preference_batch(pairs);
  const auto ref = b.at("ref_logps").values<double>();
  BOOST_TEST(std::vector<double>(ref.begin(), ref.end()) == (std::vector<double>{-1.5, -3.0, -2.25, -4.5}),
             boost::test_tools::per_element());
  std::vector<dtrain::PreferencePair> mixed = pairs;
  mixed[1].ref_chosen.reset();
  mixed[1].ref_rejected.reset();
  BOOST_CHECK_THROW(dtrain::preference_batch(mixed), dtrain::config_error);
}

BOOST_AUTO_TEST_CASE(bad_pairs_are_refused_with_their_line) {
  const std::string ok = R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]})";
  BOOST_TEST(refusal({ok}).empty());
  BOOST_TEST(refusal({ok, R"({"prompt_ids": [1], "chosen_ids": [], "rejected_ids": [3]})"})
                 .find("line 2: chosen_ids is empty") != std::string::npos);
  BOOST_TEST(refusal({R"({"prompt_ids": [1], "chosen_ids": [2]})"}).find("no rejected_ids list") != std::string::npos);
  BOOST_TEST(
      refusal({R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [50]})"}).find("not a token id in [0, 50)") !=
      std::string::npos);
  BOOST_TEST(refusal({R"({"prompt_ids": [1, 2, 3, 4, 5, 6, 7], "chosen_ids": [2, 3, 4], "rejected_ids": [3]})"})
                 .find("raise block_size to at least 9") != std::string::npos);
  BOOST_TEST(refusal({R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3], "ref_chosen_logps": -1})"})
                 .find("ref_chosen_logps alone") != std::string::npos);
  BOOST_TEST(refusal({"[1, 2]"}).find("not a JSON object") != std::string::npos);
  BOOST_TEST(refusal({"{"}).find("line 1: not valid JSON") != std::string::npos);
  BOOST_TEST(refusal({""}).find("hold no pair") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
