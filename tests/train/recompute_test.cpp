// Which units activation checkpointing recomputes (train/recompute.hpp): the
// rule the Trainer's pipeline and the estimate share, on its own.
#define BOOST_TEST_MODULE recompute
#include "dtrain/train/recompute.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "dtrain/core/error.hpp"

using dtrain::RecomputePolicy;
using dtrain::detail::recomputed_units;
using V = std::vector<char>;

BOOST_AUTO_TEST_SUITE(recompute)

// An embedding (keeps nothing), four equal blocks, a norm, a head.
const std::vector<std::int64_t> gpt_like{0, 100, 100, 100, 100, 10, 0};

BOOST_AUTO_TEST_CASE(off_every_and_units) {
  BOOST_TEST((recomputed_units(gpt_like, 4, {}) == V(7, 0)));
  BOOST_TEST((recomputed_units(gpt_like, 4, {.on = true}) == V{0, 1, 1, 1, 1, 1, 0}));
  BOOST_TEST((recomputed_units(gpt_like, 4, {.on = true, .every = 2}) == V{0, 1, 0, 1, 0, 1, 0}));
  BOOST_TEST((recomputed_units(gpt_like, 4, {.on = true, .units = {2, 4}}) == V{0, 0, 1, 0, 1, 0, 0}));
}

// Kept bytes = the others' + the largest recomputed (shared buffer).
BOOST_AUTO_TEST_CASE(budget_picks_the_fewest_largest_first) {
  // everything kept: 410 elements x 4 bytes
  BOOST_TEST((recomputed_units(gpt_like, 4, {.on = true, .budget_bytes = 1640}) == V(7, 0)));
  // 1639 bytes: one block recomputed (310 + 100 shared = 410 elements: not enough), so two
  // (210 + 100 = 310 elements = 1240 bytes)
  BOOST_TEST((recomputed_units(gpt_like, 4, {.on = true, .budget_bytes = 1639}) == V{0, 1, 1, 0, 0, 0, 0}));
  // 1240 bytes exactly: two blocks; 1239: three
  BOOST_TEST((recomputed_units(gpt_like, 4, {.on = true, .budget_bytes = 1240}) == V{0, 1, 1, 0, 0, 0, 0}));
  BOOST_TEST((recomputed_units(gpt_like, 4, {.on = true, .budget_bytes = 1239}) == V{0, 1, 1, 1, 0, 0, 0}));
  // 110 elements: the four blocks (10 kept by the norm + 100 shared)
  BOOST_TEST((recomputed_units(gpt_like, 4, {.on = true, .budget_bytes = 440}) == V{0, 1, 1, 1, 1, 0, 0}));
  // 400 bytes: the norm too, down to one block's share
  BOOST_TEST((recomputed_units(gpt_like, 4, {.on = true, .budget_bytes = 400}) == V{0, 1, 1, 1, 1, 1, 0}));
  // the largest first whatever the order (recomputing one unit alone saves
  // nothing: its buffer becomes the shared one)
  BOOST_TEST((recomputed_units({5, 50, 20, 30}, 1, {.on = true, .budget_bytes = 80}) == V{0, 1, 0, 1}));
  // off: no budget applies
  BOOST_TEST((recomputed_units(gpt_like, 4, {.budget_bytes = 4}) == V(7, 0)));
}

BOOST_AUTO_TEST_CASE(refusals_name_the_option_and_the_fix) {
  try {
    recomputed_units(gpt_like, 4, {.on = true, .budget_bytes = 399});
    BOOST_ERROR("a budget below one block's share was accepted");
  } catch (const dtrain::config_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("checkpoint_budget_bytes 399 is below what one unit keeps") != std::string::npos, what);
    BOOST_TEST(what.find("at least 400") != std::string::npos, what);
  }
  BOOST_CHECK_THROW(dtrain::detail::check_recompute_policy({.on = true, .every = 0}, 7), dtrain::config_error);
  BOOST_CHECK_THROW(dtrain::detail::check_recompute_policy({.on = true, .units = {7}}, 7), dtrain::config_error);
  BOOST_CHECK_THROW(dtrain::detail::check_recompute_policy({.on = true, .every = 2, .budget_bytes = 10}, 7),
                    dtrain::config_error);
  BOOST_CHECK_THROW(dtrain::detail::check_recompute_policy({.on = true, .units = {1}, .budget_bytes = 10}, 7),
                    dtrain::config_error);
  BOOST_CHECK_NO_THROW(dtrain::detail::check_recompute_policy({.on = true, .budget_bytes = 10}, 7));
}

BOOST_AUTO_TEST_SUITE_END()
