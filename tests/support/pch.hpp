// The tests' precompiled header (tests/CMakeLists.txt, DTRAIN_TEST_PCH): what
// most test translation units include, parsed once per build instead of once
// per translation unit. It holds only dtrain and the standard library, not
// Boost.Test, whose header a test's own BOOST_TEST_MODULE shapes. Each test
// still includes what it uses: a build with -DDTRAIN_TEST_PCH=OFF checks that.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <dtrain/comm/store.hpp>
#include <dtrain/run/fit.hpp>
#include <dtrain/train/estimate.hpp>
#include <dtrain/trainer.hpp>
