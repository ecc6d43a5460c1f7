#define BOOST_TEST_MODULE optim_config
#include "dtrain/optim/config.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "optim/expect_config_error.hpp"
#include <boost/test/unit_test.hpp>

namespace {
using dtrain::AdamW;
using dtrain::ClipOptions;
using dtrain::SGD;

constexpr float not_a_number = std::numeric_limits<float>::quiet_NaN();
constexpr float inf = std::numeric_limits<float>::infinity();

struct NamedConfig {
  static constexpr std::string_view name = "named";
  float lr = 1.f;
  void validate() const {}
};
struct NoName {
  float lr = 1.f;
  void validate() const {}
};
struct NoValidate {
  static constexpr std::string_view name = "no_validate";
  float lr = 1.f;
};
static_assert(dtrain::Optimizer<AdamW>);
static_assert(dtrain::Optimizer<SGD>);
// Settings alone are not an optimizer: the concept needs the rule too
// (optimizer_test has a complete user optimizer).
static_assert(!dtrain::Optimizer<NamedConfig>);
static_assert(!dtrain::Optimizer<NoName>);
static_assert(!dtrain::Optimizer<NoValidate>);
static_assert(!dtrain::Optimizer<ClipOptions>);  // settings, not an optimizer
static_assert(!dtrain::Optimizer<int>);
}  // namespace

BOOST_AUTO_TEST_CASE(defaults_are_pytorchs_and_valid) {
  const AdamW adamw{};
  BOOST_TEST(adamw.lr == 1e-3f);
  BOOST_TEST(adamw.beta1 == 0.9f);
  BOOST_TEST(adamw.beta2 == 0.999f);
  BOOST_TEST(adamw.eps == 1e-8f);
  BOOST_TEST(adamw.weight_decay == 0.01f);
  adamw.validate();

  const SGD sgd{};
  BOOST_TEST(sgd.lr == 1e-2f);
  BOOST_TEST(sgd.momentum == 0.f);
  BOOST_TEST(!sgd.nesterov);
  sgd.validate();

  BOOST_TEST(!ClipOptions{}.enabled());
  BOOST_TEST(ClipOptions{.max_norm = 1.f}.enabled());
  ClipOptions{}.validate();
}

BOOST_AUTO_TEST_CASE(designated_initialisers_keep_the_other_defaults) {
  const AdamW a{.lr = 3e-4f, .weight_decay = 0.1f};
  BOOST_TEST(a.lr == 3e-4f);
  BOOST_TEST(a.beta2 == 0.999f);
  BOOST_TEST(a.weight_decay == 0.1f);
  const SGD s{.lr = 0.1f, .momentum = 0.9f, .nesterov = true};
  s.validate();
  BOOST_TEST(s.weight_decay == 0.f);
}

BOOST_AUTO_TEST_CASE(adamw_rejects_each_bad_field) {
  for (float lr : {0.f, -1e-3f, not_a_number, inf})
    expect_config_error([&] { AdamW{.lr = lr}.validate(); }, "AdamW.lr");
  for (float beta : {-0.1f, 1.f, 1.5f, not_a_number}) {
    expect_config_error([&] { AdamW{.beta1 = beta}.validate(); }, "AdamW.beta1");
    expect_config_error([&] { AdamW{.beta2 = beta}.validate(); }, "AdamW.beta2");
  }
  for (float eps : {0.f, -1e-8f, not_a_number}) expect_config_error([&] { AdamW{.eps = eps}.validate(); }, "AdamW.eps");
  expect_config_error([] { AdamW{.weight_decay = -0.01f}.validate(); }, "AdamW.weight_decay");
  // Edges that are valid.
  AdamW{.beta1 = 0.f, .beta2 = 0.f, .weight_decay = 0.f}.validate();
}

BOOST_AUTO_TEST_CASE(sgd_rejects_each_bad_field) {
  for (float lr : {0.f, -0.1f, not_a_number}) expect_config_error([&] { SGD{.lr = lr}.validate(); }, "SGD.lr");
  expect_config_error([] { SGD{.momentum = -0.9f}.validate(); }, "SGD.momentum");
  expect_config_error([] { SGD{.weight_decay = -1e-4f}.validate(); }, "SGD.weight_decay");
  expect_config_error([] { SGD{.nesterov = true}.validate(); }, "SGD.nesterov");
  expect_config_error([] { ClipOptions{.max_norm = -1.f}.validate(); }, "ClipOptions.max_norm");
  expect_config_error([] { ClipOptions{.max_norm = not_a_number}.validate(); }, "ClipOptions.max_norm");
}

BOOST_AUTO_TEST_CASE(errors_show_the_value_and_a_fix) {
  try {
    AdamW{.eps = -1e-8f}.validate();
    BOOST_FAIL("no config_error");
  } catch (const dtrain::config_error& e) {
    BOOST_TEST(e.problem() == "AdamW.eps = -1e-08 must be a finite number > 0");
    BOOST_TEST(e.fix() == "set .eps to a finite number > 0");
  }
}
