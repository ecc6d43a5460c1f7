#define BOOST_TEST_MODULE policy
#include "dtrain/policy/policies.hpp"

#include <type_traits>

#include <boost/test/unit_test.hpp>

#include "dtrain/core/dtype.hpp"

// Most of this file is checked by the compiler: the concepts on good and bad
// types, and composition in any order with defaults. The compile-fail tests
// in fail/ check the error messages.

namespace {
using namespace dtrain;

// --- each slot's concept -----------------------------------------------------
static_assert(StrategyPolicy<Strategy<DDP>>);
static_assert(StrategyPolicy<Strategy<FSDP<FullShard>>> && StrategyPolicy<Strategy<FSDP<ShardGradOp>>> &&
              StrategyPolicy<Strategy<FSDP<NoShard>>> && StrategyPolicy<Strategy<FSDP<HybridShard>>>);
static_assert(StrategyPolicy<Strategy<FSDP<>>>);  // FullShard by default
static_assert(std::is_same_v<FSDP<>::mode, FullShard>);
static_assert(StrategyPolicy<Strategy<ZeRO1>>);
static_assert(!StrategyPolicy<Strategy<int>>);
static_assert(!StrategyPolicy<Strategy<FSDP<DDP>>>);  // not an FSDP mode
static_assert(!StrategyPolicy<Strategy<FullShard>>);  // a mode needs FSDP<>
static_assert(!StrategyPolicy<DDP>);                  // the kind alone is not a policy
static_assert(!StrategyPolicy<FSDP<FullShard>> && !StrategyPolicy<ZeRO1>);

// The names train_mlp's strategy= key and the docs use.
static_assert(DDP::name == "ddp" && FSDP<FullShard>::name == "fsdp-full" && FSDP<ShardGradOp>::name == "fsdp-grad-op" &&
              FSDP<NoShard>::name == "fsdp-no-shard" && FSDP<HybridShard>::name == "fsdp-hybrid" &&
              ZeRO1::name == "zero1");

static_assert(PrecisionPolicy<Precision<fp32>>);
static_assert(PrecisionPolicy<Precision<bf16>>);
static_assert(PrecisionPolicy<Precision<fp16>>);
static_assert(PrecisionPolicy<Precision<fp32, bf16>>);
static_assert(PrecisionPolicy<Precision<bf16, bf16>>);
static_assert(PrecisionPolicy<Precision<fp16, fp16>>);
static_assert(PrecisionPolicy<Precision<fp16, fp32>>);
static_assert(!PrecisionPolicy<Precision<fp16, bf16>>);
static_assert(!PrecisionPolicy<Precision<bf16, fp16>>);
static_assert(!PrecisionPolicy<Precision<fp32, fp16>>);
static_assert(!PrecisionPolicy<Precision<double>>);
static_assert(!PrecisionPolicy<Precision<bf16, int>>);
static_assert(!PrecisionPolicy<bf16>);

static_assert(AccumulatePolicy<Accumulate<1>>);
static_assert(AccumulatePolicy<Accumulate<8>>);
static_assert(!AccumulatePolicy<Accumulate<0>>);
static_assert(!AccumulatePolicy<Accumulate<-2>>);
static_assert(!AccumulatePolicy<std::integral_constant<int, 4>>);

static_assert(DevicePolicy<Device<Host>>);
static_assert(DevicePolicy<Device<Cuda>>);
static_assert(!DevicePolicy<Device<int>>);
static_assert(!DevicePolicy<Host>);

static_assert(Policy<Strategy<DDP>> && Policy<Precision<bf16>> && Policy<Accumulate<2>> && Policy<Device<Host>>);
static_assert(!Policy<int> && !Policy<Accumulate<0>> && !Policy<Precision<fp16, bf16>>);
static_assert(!Policy<DDP> && !Policy<bf16> && !Policy<Host>);  // a bare kind is not a policy
static_assert(Policy<Strategy<FSDP<HybridShard>>> && Policy<Strategy<ZeRO1>>);
static_assert(!Policy<FSDP<FullShard>> && !Policy<ZeRO1> && !Policy<FullShard>);

// --- Precision's types ---------------------------------------------------------
static_assert(std::is_same_v<Precision<bf16>::param_type, bf16>);
static_assert(std::is_same_v<Precision<bf16>::reduce_type, fp32>);
static_assert(std::is_same_v<Precision<fp16, fp16>::reduce_type, fp16>);
static_assert(std::is_same_v<Precision<fp16>::master_type, fp32>);
static_assert(Precision<fp16>::loss_scaling && !Precision<bf16>::loss_scaling && !Precision<fp32>::loss_scaling);

// --- composition -------------------------------------------------------------
// Every slot read, so two compositions agree on all of them.
template <class A, class B>
constexpr bool same_policies =
    std::is_same_v<typename A::strategy, typename B::strategy>&& std::is_same_v<
        typename A::precision, typename B::precision>&& std::is_same_v<typename A::param_type, typename B::param_type>&&
        std::is_same_v<typename A::reduce_type, typename B::reduce_type>&&
            std::is_same_v<typename A::master_type, typename B::master_type>&& A::accumulate ==
    B::accumulate&& std::is_same_v<typename A::device, typename B::device>;

using S = Strategy<DDP>;
using Pr = Precision<fp16, fp16>;
using A = Accumulate<3>;
using D = Device<Cuda>;
using Full = policies<S, Pr, A, D>;

static_assert(std::is_same_v<Full::strategy, DDP>);
static_assert(std::is_same_v<Full::precision, Pr>);
static_assert(std::is_same_v<Full::param_type, fp16>);
static_assert(std::is_same_v<Full::reduce_type, fp16>);
static_assert(std::is_same_v<Full::master_type, fp32>);
static_assert(Full::accumulate == 3);
static_assert(std::is_same_v<Full::device, Cuda>);

static_assert(same_policies<Full, policies<D, A, Pr, S>>);
static_assert(same_policies<Full, policies<A, S, D, Pr>>);
static_assert(same_policies<Full, policies<Pr, D, S, A>>);
static_assert(same_policies<Full, policies<D, Pr, A, S>>);
static_assert(same_policies<Full, policies<S, A, D, Pr>>);

// Defaults: DDP, fp32 everywhere, one micro-batch, Host outside nvcc (the
// Cuda default is checked by nvcc_default_device.cu in CUDA builds).
using Defaults = policies<>;
static_assert(std::is_same_v<Defaults::strategy, DDP>);
static_assert(std::is_same_v<Defaults::precision, Precision<fp32, fp32>>);
static_assert(std::is_same_v<Defaults::param_type, fp32> && std::is_same_v<Defaults::reduce_type, fp32>);
static_assert(Defaults::accumulate == 1);
static_assert(std::is_same_v<Defaults::device, Host>);
static_assert(same_policies<Defaults, policies<S, Precision<fp32>, Accumulate<1>, Device<Host>>>);

// Each slot alone changes only that slot.
static_assert(same_policies<policies<S>, Defaults>);
static_assert(same_policies<policies<Precision<bf16>>, policies<S, Precision<bf16>, Accumulate<1>, Device<Host>>>);
static_assert(same_policies<policies<Accumulate<5>>, policies<S, Precision<fp32>, Accumulate<5>, Device<Host>>>);
static_assert(same_policies<policies<Device<Cuda>>, policies<S, Precision<fp32>, Accumulate<1>, Device<Cuda>>>);
static_assert(same_policies<policies<Device<Cuda>, Precision<fp32, bf16>>,
                            policies<S, Precision<fp32, bf16>, Accumulate<1>, Device<Cuda>>>);

// Every strategy kind reaches P::strategy unchanged, in any position.
static_assert(std::is_same_v<policies<Accumulate<2>, Strategy<FSDP<HybridShard>>>::strategy, FSDP<HybridShard>>);
static_assert(std::is_same_v<policies<Strategy<ZeRO1>, Precision<bf16>>::strategy, ZeRO1>);
static_assert(same_policies<policies<Strategy<FSDP<NoShard>>, Precision<bf16>>,
                            policies<Precision<bf16>, Strategy<FSDP<NoShard>>>>);

// Policies are empty tags: composing them costs nothing at run time.
static_assert(std::is_empty_v<S> && std::is_empty_v<Pr> && std::is_empty_v<A> && std::is_empty_v<D> &&
              std::is_empty_v<Full> && std::is_empty_v<Strategy<FSDP<FullShard>>> && std::is_empty_v<FSDP<>>);
}  // namespace

BOOST_AUTO_TEST_CASE(composed_policies_describe_themselves) {
  using P = policies<Accumulate<4>, Precision<bf16>, Device<Host>>;
  BOOST_TEST(P::strategy::name == "ddp");
  BOOST_TEST(dtype_traits<P::param_type>::name == "bf16");
  BOOST_TEST(dtype_traits<P::reduce_type>::name == "fp32");
  BOOST_TEST(dtype_traits<P::master_type>::name == "fp32");
  BOOST_TEST(P::accumulate == 4);
  BOOST_TEST(!P::precision::loss_scaling);

  using H = policies<Precision<fp16, fp16>>;
  BOOST_TEST(dtype_traits<H::param_type>::name == "fp16");
  BOOST_TEST(dtype_traits<H::reduce_type>::name == "fp16");
  BOOST_TEST(H::precision::loss_scaling);
}
