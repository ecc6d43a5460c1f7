// The PixArt units (nn/pixart_units.hpp) on dtrain::Cuda: their GPU path
// compiles (float and bf16) and, until a GPU run has checked it, refuses to
// run without DTRAIN_GPU_VISION=on, naming the switch, as the other vision
// units do. Needs a GPU; exits 77 without one.
#include "support/gpu_main.hpp"
// gpu_main.hpp first: it sets Boost.Test up for its own main() before anything includes Boost.Test.

#include <cstdlib>
#include <string>

#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/models/pixart.hpp"
#include "dtrain/nn/pixart_units.hpp"

namespace {

bool names_the_switch(const dtrain::config_error& e) {
  return std::string(e.what()).find("DTRAIN_GPU_VISION=on") != std::string::npos;
}

// Forward and backward of `unit` on the GPU in T: refused before they touch
// any memory.
template <class T, class U>
void refused(U& unit) {
  ::unsetenv("DTRAIN_GPU_VISION");
  dtrain::Cuda dev(0);
  const dtrain::UnitContext<T> ctx;
  const auto forward = [&] { unit.template forward<dtrain::Cuda, T>(dev, {}, {}, {}, ctx); };
  const auto backward = [&] { unit.template backward<dtrain::Cuda, T>(dev, {}, {}, {}, {}, {}, {}, ctx); };
  BOOST_CHECK_EXCEPTION(forward(), dtrain::config_error, names_the_switch);
  BOOST_CHECK_EXCEPTION(backward(), dtrain::config_error, names_the_switch);
}

}  // namespace

BOOST_AUTO_TEST_CASE(pixart_units_are_off_without_the_switch) {
  dtrain::nn::PixArtInput input(4, 16, {8, 12}, {.caption_channels = 12, .context_length = 6});
  dtrain::nn::PixArtBlock block(2, 8, 24, {.context_length = 6});
  dtrain::nn::PixArtOutput output(16, 8, {8, 12}, 2);
  refused<float>(input);
  refused<float>(block);
  refused<float>(output);
  refused<dtrain::bf16>(input);
  refused<dtrain::bf16>(block);
  refused<dtrain::bf16>(output);
  // the model's units, through nn::OneOf
  dtrain::models::PixArtConfig c;
  c.num_layers = 1;
  dtrain::models::PixArt model(c);
  for (auto& u : model.layers) refused<float>(u);
}
