#pragma once
// Shared by the optim tests: the call must throw dtrain::config_error whose
// problem text names `field` and which carries a fix.

#include <string>
#include <string_view>

#include <boost/test/unit_test.hpp>

#include "dtrain/core/error.hpp"

template <class F>
void expect_config_error(F&& f, std::string_view field) {
  try {
    f();
    BOOST_ERROR("no config_error for " << field);
  } catch (const dtrain::config_error& e) {
    BOOST_TEST(e.problem().find(field) != std::string::npos, e.problem() << " does not name " << field);
    BOOST_TEST(!e.fix().empty());
  }
}
