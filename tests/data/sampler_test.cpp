#define BOOST_TEST_MODULE data
#include "dtrain/data/sampler.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include <boost/test/unit_test.hpp>

using dtrain::DistributedSampler;
using dtrain::SamplerOptions;
using dtrain::SamplerState;
using Indices = std::vector<std::int64_t>;

namespace {

Indices to_vector(std::span<const std::int64_t> s) { return {s.begin(), s.end()}; }

// The global order the ranks' shards interleave back into: entry i*W + r is
// rank r's i-th index.
Indices interleave(std::int64_t n, int world, SamplerOptions opt, std::int64_t epoch) {
  std::vector<Indices> shards;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, r, world, opt);
    s.set_epoch(epoch);
    shards.push_back(to_vector(s.indices()));
  }
  Indices global;
  for (std::size_t i = 0; i < shards[0].size(); ++i)
    for (int r = 0; r < world; ++r) {
      BOOST_TEST_REQUIRE(shards[static_cast<std::size_t>(r)].size() == shards[0].size());
      global.push_back(shards[static_cast<std::size_t>(r)][i]);
    }
  return global;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sampler)

// splitmix64 from state 0 must give the published reference outputs, and
// the shuffle built on it a fixed order: a change to either breaks every
// saved sampler position, so it must be deliberate (update docs/data.md).
BOOST_AUTO_TEST_CASE(pinned_generator_and_permutation) {
  dtrain::detail::SplitMix64 rng(0);
  BOOST_TEST(rng.next() == 0xe220a8397b1dcdafull);
  BOOST_TEST(rng.next() == 0x6e789e6aa1b965f4ull);
  BOOST_TEST(rng.next() == 0x06c45d188009454full);

  DistributedSampler s(10, 0, 1, {.shuffle = true, .seed = 0});
  BOOST_TEST(to_vector(s.indices()) == (Indices{6, 3, 2, 9, 8, 1, 4, 7, 0, 5}), boost::test_tools::per_element());
  s.set_epoch(1);
  BOOST_TEST(to_vector(s.indices()) == (Indices{7, 4, 3, 8, 5, 9, 2, 0, 6, 1}), boost::test_tools::per_element());
  DistributedSampler r1(10, 1, 3, {.shuffle = true, .seed = 42});
  BOOST_TEST(to_vector(r1.indices()) == (Indices{7, 0, 5, 4}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(shards_are_disjoint_and_cover_the_same_permutation) {
  for (const std::int64_t n : {1, 2, 7, 10, 13, 64})
    for (int world = 1; world <= 4; ++world)
      for (const std::uint64_t seed : {0ull, 9ull}) {
        BOOST_TEST_CONTEXT("n=" << n << " world=" << world << " seed=" << seed) {
          const SamplerOptions pad{.shuffle = true, .seed = seed, .drop_last = false};
          // One rank's view of the whole dataset is the permutation itself.
          const Indices perm = to_vector(DistributedSampler(n, 0, 1, pad).indices());
          Indices sorted = perm;
          std::ranges::sort(sorted);
          for (std::int64_t i = 0; i < n; ++i) BOOST_TEST(sorted[static_cast<std::size_t>(i)] == i);

          const std::int64_t per_rank = (n + world - 1) / world;
          BOOST_TEST(DistributedSampler(n, world - 1, world, pad).num_samples() == per_rank);
          const Indices padded = interleave(n, world, pad, 0);
          BOOST_TEST_REQUIRE(static_cast<std::int64_t>(padded.size()) == per_rank * world);
          // Padding wraps around to the permutation's head.
          for (std::size_t i = 0; i < padded.size(); ++i) BOOST_TEST(padded[i] == perm[i % perm.size()]);

          if (n < world) continue;
          const SamplerOptions drop{.shuffle = true, .seed = seed, .drop_last = true};
          BOOST_TEST(DistributedSampler(n, 0, world, drop).num_samples() == n / world);
          const Indices dropped = interleave(n, world, drop, 0);
          BOOST_TEST(dropped.size() == static_cast<std::size_t>(n / world * world));
          BOOST_TEST(std::equal(dropped.begin(), dropped.end(), perm.begin()));  // distinct: a prefix of perm
        }
      }
}

BOOST_AUTO_TEST_CASE(epochs_and_seeds_change_the_order_reproducibly) {
  DistributedSampler a(100, 1, 2, {.seed = 5});
  const Indices e0 = to_vector(a.indices());
  a.set_epoch(1);
  const Indices e1 = to_vector(a.indices());
  BOOST_TEST(e0 != e1);
  a.set_epoch(0);
  BOOST_TEST(to_vector(a.indices()) == e0, boost::test_tools::per_element());
  BOOST_TEST(to_vector(DistributedSampler(100, 1, 2, {.seed = 6}).indices()) != e0);

  DistributedSampler plain(10, 1, 4, {.shuffle = false});
  plain.set_epoch(3);
  BOOST_TEST(to_vector(plain.indices()) == (Indices{1, 5, 9}), boost::test_tools::per_element());
}

// A wrong bound in Fisher-Yates (e.g. Sattolo's i instead of i + 1) or a
// biased draw skews which permutations appear; with 24000 epochs each of the
// 24 orders of 4 items is expected 1000 times (sd ~31).
BOOST_AUTO_TEST_CASE(every_permutation_is_equally_likely) {
  std::map<Indices, int> counts;
  DistributedSampler s(4, 0, 1, {.seed = 1});
  for (std::int64_t e = 0; e < 24000; ++e) {
    s.set_epoch(e);
    ++counts[to_vector(s.indices())];
  }
  BOOST_TEST(counts.size() == 24u);
  for (const auto& [perm, c] : counts) BOOST_TEST((c > 850 && c < 1150), "count " << c);
}

BOOST_AUTO_TEST_CASE(next_crosses_epochs_and_resumes_from_state) {
  const SamplerOptions opt{.seed = 3};
  DistributedSampler s(10, 2, 3, opt);  // 4 samples per epoch
  std::vector<Indices> epochs;
  for (std::int64_t e = 0; e < 3; ++e) {
    DistributedSampler ref(10, 2, 3, opt);
    ref.set_epoch(e);
    epochs.push_back(to_vector(ref.indices()));
  }
  const Indices first = s.next(3);
  BOOST_TEST(first == Indices(epochs[0].begin(), epochs[0].begin() + 3), boost::test_tools::per_element());
  const SamplerState saved = s.state();
  BOOST_TEST((saved == SamplerState{0, 3}));

  const Indices rest = s.next(6);
  Indices expected{epochs[0][3]};
  expected.insert(expected.end(), epochs[1].begin(), epochs[1].end());
  expected.push_back(epochs[2][0]);
  BOOST_TEST(rest == expected, boost::test_tools::per_element());
  BOOST_TEST((s.state() == SamplerState{2, 1}));

  DistributedSampler resumed(10, 2, 3, opt);
  resumed.load_state(saved);
  BOOST_TEST(resumed.next(6) == rest, boost::test_tools::per_element());

  // An epoch used up exactly: next() starts the following one.
  DistributedSampler full(10, 2, 3, opt);
  full.load_state({1, 4});
  BOOST_TEST(full.next(1) == Indices{epochs[2][0]}, boost::test_tools::per_element());
  BOOST_TEST(full.next(0).empty());
}

BOOST_AUTO_TEST_CASE(accepts_a_world) {
  struct FakeWorld {
    int rank() const { return 1; }
    int size() const { return 3; }
  };
  DistributedSampler s(10, FakeWorld{}, {.seed = 42});
  BOOST_TEST(s.rank() == 1);
  BOOST_TEST(s.world_size() == 3);
  BOOST_TEST(to_vector(s.indices()) == (Indices{7, 0, 5, 4}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(rejects_bad_configurations) {
  BOOST_CHECK_THROW(DistributedSampler(10, 0, 0), dtrain::config_error);
  BOOST_CHECK_THROW(DistributedSampler(10, 3, 3), dtrain::config_error);
  BOOST_CHECK_THROW(DistributedSampler(10, -1, 3), dtrain::config_error);
  BOOST_CHECK_THROW(DistributedSampler(0, 0, 1), dtrain::config_error);
  BOOST_CHECK_THROW(DistributedSampler(2, 0, 3, {.drop_last = true}), dtrain::config_error);
  DistributedSampler tiny(2, 2, 3);  // padding alone gives rank 2 a sample
  BOOST_TEST(tiny.num_samples() == 1);

  DistributedSampler s(10, 0, 3);
  BOOST_CHECK_THROW(s.load_state({0, 5}), dtrain::config_error);
  BOOST_CHECK_THROW(s.load_state({-1, 0}), dtrain::config_error);
  BOOST_CHECK_THROW(s.next(-1), dtrain::config_error);
  try {
    DistributedSampler(10, 4, 3);
    BOOST_FAIL("expected config_error");
  } catch (const dtrain::config_error& e) {
    BOOST_TEST(e.problem().find("rank 4") != std::string::npos);
    BOOST_TEST(!e.fix().empty());
  }
}

BOOST_AUTO_TEST_SUITE_END()
