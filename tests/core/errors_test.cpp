#include <string>

#include <boost/test/unit_test.hpp>

#include <dtrain/core/error.hpp>

BOOST_AUTO_TEST_CASE(errors_carry_problem_fix_and_location) {
  try {
    throw dtrain::config_error("batch_size is 0", "set batch_size >= 1");
  } catch (const dtrain::error& e) {
    const std::string what = e.what();
    BOOST_TEST(e.problem() == "batch_size is 0");
    BOOST_TEST(e.fix() == "set batch_size >= 1");
    BOOST_TEST(what.find("fix: set batch_size >= 1") != std::string::npos);
    BOOST_TEST(what.find("errors_test.cpp:") != std::string::npos);  // where it was thrown
    BOOST_TEST(std::string(e.where().file_name()).find("errors_test.cpp") != std::string::npos);
  }
  BOOST_CHECK_THROW(throw dtrain::timeout_error("t"), dtrain::comm_error);
  BOOST_CHECK_THROW(throw dtrain::nccl_error(3, "n"), dtrain::comm_error);
}
