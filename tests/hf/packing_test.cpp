// Packed records (position_ids, transformers' padding-free packing): a
// block of records packed end to end trains as the records do one by one.
// The loss and every parameter's gradient of one packed step equal those of
// the same records as separate micro-batches (accumulated), on Llama (rotary
// positions restart per record) and GPT-2 (learned positions restart), at one
// rank (DDP) and two (FSDP, each rank its own records).
#include "hf/packing.hpp"

#include <boost/test/unit_test.hpp>

using namespace dtrain;
namespace p = dtrain::testing::packing;

BOOST_AUTO_TEST_SUITE(packing)

BOOST_AUTO_TEST_CASE(packed_records_train_as_the_records_one_by_one) {
  p::packed_records_train_as_the_records_one_by_one<Host>();
}

// Bad position ids are one clear error naming the sequence and position.
BOOST_AUTO_TEST_CASE(bad_position_ids_are_refused) {
  dtrain::testing::run_ranks(1, [&](World& w) {
    hf::CausalLm model(p::config_of("llama"));
    Trainer<hf::CausalLm> trainer(w, model, SGD{});
    Batch b = p::packed(p::records(0));
    std::vector<std::int64_t> pos(14, 0);
    for (std::size_t t = 0; t < pos.size(); ++t) pos[t] = static_cast<std::int64_t>(t == 7 ? 5 : t);  // a jump
    b.set("position_ids", HostTensor::of(pos, {1, 14}));
    try {
      trainer.step(std::span(&b, 1));
      BOOST_ERROR("no error for position ids that jump");
    } catch (const config_error& e) {
      BOOST_TEST(std::string(e.what()).find("position_ids of sequence 0 go 6 to 5 at position 7") != std::string::npos,
                 e.what());
    }
  });
}

BOOST_AUTO_TEST_SUITE_END()
