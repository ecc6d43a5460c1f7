// The one translation unit that compiles dtrain's cuDNN fused attention
// (declared in include/dtrain/backend/cuda/device_attention.hpp): the
// dtrain_cudnn library in dtrain's build, the dtrain::cudnn target's source
// in an installed package (docs/gpu.md, "Fused attention"). It is
// non-template code that includes the heavy cudnn-frontend headers, so it is
// compiled once into a program rather than in every translation unit that
// trains on a GPU. Everything here builds and looks up cuDNN graphs, once per
// shape and then from a cache, and the cudnn-frontend headers are large: in
// an optimised GCC build it compiles at -O1 (87 -> 47 s and 2.5 -> 2.1 GB of
// the compiler's memory on a 2-core machine), the same as header-only
// dtrain's set-up code (DTRAIN_IMPL_O1). Define DTRAIN_CUDNN_O1=0 for the
// build's level.
#if !defined(DTRAIN_CUDNN_O1)
#define DTRAIN_CUDNN_O1 1
#endif
#if DTRAIN_CUDNN_O1 && defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__)
#pragma GCC optimize("O1")
#endif

#include <dtrain/backend/cuda/device_attention.hpp>

#if DTRAIN_HAS_CUDA && DTRAIN_HAS_CUDNN

#include <cudnn.h>
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

// The frontend calls cuDNN through this handle (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace dtrain {

namespace detail {

namespace fe = cudnn_frontend;

// Loads cuDNN 9 on first use, or says what is missing.
inline void load_cudnn() {
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"})
      if ((fe::cudnn_dlhandle = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) != nullptr) return;
    const char* why = dlerror();
    failure = why != nullptr ? why : "libcudnn.so.9 not found";
  });
  if (fe::cudnn_dlhandle == nullptr)
    throw config_error("DTRAIN_ATTENTION=cudnn, but cuDNN 9 cannot be loaded: " + failure,
                       "install cuDNN 9 (its libcudnn.so.9 on the loader path: ldconfig or LD_LIBRARY_PATH), or set "
                       "DTRAIN_ATTENTION=reference");
}

enum attention_uid : fe::graph::Tensor_attributes::uid_t {
  uid_q = 1,
  uid_k,
  uid_v,
  uid_o,
  uid_stats,
  uid_bias,
  uid_scale,
  uid_do,
  uid_dq,
  uid_dk,
  uid_dv
};

inline void cudnn_check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw cuda_error(std::string(what) + " failed: " + cudnn_frontend::detail::get_error_string(status),
                     "check that cuDNN 9 matches the CUDA toolkit and driver; DTRAIN_ATTENTION=reference avoids cuDNN");
}

inline void frontend_check(const fe::error_t& e, const std::string& what) {
  if (e.is_bad())
    throw cuda_error("cuDNN attention: " + what + " failed: " + e.err_msg,
                     "DTRAIN_ATTENTION=reference runs the attention without cuDNN");
}

inline fe::DataType_t cudnn_io_type(attention_dtype t) {
  return t == attention_dtype::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// The cuDNN handle and graphs of one Cuda device (Cuda::extension): ranks
// that are threads of one process each have their own.
class CudnnAttentionState {
 public:
  explicit CudnnAttentionState(cuda_state& dev) : dev_(dev) {
    load_cudnn();
    cuda_check(cudaSetDevice(dev.device()), "cudaSetDevice");
    cudnn_check(fe::detail::create_handle(&handle_), "cudnnCreate");
  }
  CudnnAttentionState(const CudnnAttentionState&) = delete;
  CudnnAttentionState& operator=(const CudnnAttentionState&) = delete;
  ~CudnnAttentionState() {
    if (handle_ != nullptr) (void)fe::detail::destroy_handle(handle_);
  }

  using Key = std::tuple<FusedAttentionShape, bool /* backward */, attention_dtype>;

  // The graph for `key`, built on first use; null when cuDNN cannot run it
  // (remembered: a problem is tried once).
  const fe::graph::Graph* graph(const FusedAttentionShape& s, bool backward, attention_dtype t) {
    const Key key{s, backward, t};
    if (auto it = graphs_.find(key); it != graphs_.end()) return it->second.get();
    std::shared_ptr<fe::graph::Graph> g = backward ? build_backward(s, t) : build_forward(s, t);
    if (g) {
      std::int64_t bytes = 0;
      frontend_check(g->get_workspace_size(bytes), "get_workspace_size");
      workspace_bytes_ = std::max<std::size_t>(workspace_bytes_, static_cast<std::size_t>(bytes));
    }
    return graphs_.emplace(key, std::move(g)).first->second.get();
  }

  void run(const fe::graph::Graph& g, std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*>& pack) {
    cudnn_check(fe::detail::set_stream(handle_, dev_.stream()), "cudnnSetStream");
    std::byte* ws = dev_.extra_workspace(workspace_bytes_);
    frontend_check(g.execute(handle_, pack, ws), "execute");
  }

 private:
  static std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph& g, const char* name,
                                                              fe::graph::Tensor_attributes::uid_t uid,
                                                              const FusedAttentionShape& s, std::int64_t heads,
                                                              const AttentionStrides& st) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({s.batch, heads, s.time, s.head_dim})
                        .set_stride({st.batch, st.head, st.row, 1}));
  }

  static std::shared_ptr<fe::graph::Graph> new_graph(attention_dtype t) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(cudnn_io_type(t))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
  }

  static std::shared_ptr<fe::graph::Tensor_attributes> scale(fe::graph::Graph& g) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name("attn_scale")
                        .set_uid(uid_scale)
                        .set_dim({1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_is_pass_by_value(true)
                        .set_data_type(fe::DataType_t::FLOAT));
  }

  // [B, 1, T, T]: a row of key biases per query, broadcast over heads (a
  // [B, 1, 1, T] bias broadcast over queries gave wrong gradients).
  static std::shared_ptr<fe::graph::Tensor_attributes> bias(fe::graph::Graph& g, const FusedAttentionShape& s) {
    const std::int64_t tt = s.time * s.time;
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name("key_bias")
                        .set_uid(uid_bias)
                        .set_dim({s.batch, 1, s.time, s.time})
                        .set_stride({tt, tt, s.time, 1}));
  }

  static std::shared_ptr<fe::graph::Tensor_attributes> stats(fe::graph::Graph& g, const FusedAttentionShape& s) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name("stats")
                        .set_uid(uid_stats)
                        .set_dim({s.batch, s.heads, s.time, 1})
                        .set_stride({s.heads * s.time, s.time, 1, 1})
                        .set_data_type(fe::DataType_t::FLOAT));
  }

  // Builds and plans `g`; null when cuDNN has no engine for it.
  std::shared_ptr<fe::graph::Graph> finish(std::shared_ptr<fe::graph::Graph> g) {
    if (g->validate().is_bad() || g->build_operation_graph(handle_).is_bad() ||
        g->create_execution_plans({fe::HeurMode_t::A}).is_bad() || g->check_support(handle_).is_bad() ||
        g->build_plans(handle_).is_bad())
      return nullptr;
    return g;
  }

  std::shared_ptr<fe::graph::Graph> build_forward(const FusedAttentionShape& s, attention_dtype t) {
    auto g = new_graph(t);
    auto q = tensor(*g, "q", uid_q, s, s.heads, s.q);
    auto k = tensor(*g, "k", uid_k, s, s.kv_heads, s.k);
    auto v = tensor(*g, "v", uid_v, s, s.kv_heads, s.v);
    auto options = fe::graph::SDPA_attributes().set_name("dtrain_attention").set_generate_stats(true);
    options.set_attn_scale(scale(*g)).set_causal_mask(true);
    if (s.key_bias) options.set_bias(bias(*g, s));
    auto [o, st] = g->sdpa(q, k, v, options);
    o->set_output(true)
        .set_uid(uid_o)
        .set_dim({s.batch, s.heads, s.time, s.head_dim})
        .set_stride({s.o.batch, s.o.head, s.o.row, 1});
    st->set_output(true)
        .set_uid(uid_stats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({s.batch, s.heads, s.time, 1})
        .set_stride({s.heads * s.time, s.time, 1, 1});
    return finish(std::move(g));
  }

  std::shared_ptr<fe::graph::Graph> build_backward(const FusedAttentionShape& s, attention_dtype t) {
    auto g = new_graph(t);
    auto q = tensor(*g, "q", uid_q, s, s.heads, s.q);
    auto k = tensor(*g, "k", uid_k, s, s.kv_heads, s.k);
    auto v = tensor(*g, "v", uid_v, s, s.kv_heads, s.v);
    auto o = tensor(*g, "o", uid_o, s, s.heads, s.o);
    auto d_o = tensor(*g, "do", uid_do, s, s.heads, s.o);
    auto options = fe::graph::SDPA_backward_attributes().set_name("dtrain_attention_backward");
    options.set_attn_scale(scale(*g)).set_causal_mask(true).set_deterministic_algorithm(true);
    if (s.key_bias) options.set_bias(bias(*g, s));
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats(*g, s), options);
    const auto out = [&](std::shared_ptr<fe::graph::Tensor_attributes>& t, fe::graph::Tensor_attributes::uid_t uid,
                         std::int64_t heads, const AttentionStrides& st) {
      t->set_output(true)
          .set_uid(uid)
          .set_dim({s.batch, heads, s.time, s.head_dim})
          .set_stride({st.batch, st.head, st.row, 1});
    };
    out(dq, uid_dq, s.heads, s.q);
    out(dk, uid_dk, s.kv_heads, s.k);
    out(dv, uid_dv, s.kv_heads, s.v);
    return finish(std::move(g));
  }

  cuda_state& dev_;  // owns this object
  cudnnHandle_t handle_ = nullptr;
  std::map<Key, std::shared_ptr<fe::graph::Graph>> graphs_;
  std::size_t workspace_bytes_ = 0;
};

}  // namespace detail

bool cudnn_attention_supported(Cuda& dev, const FusedAttentionShape& s, attention_dtype t) {
  auto& st = dev.extension<detail::CudnnAttentionState>();
  return st.graph(s, false, t) != nullptr && st.graph(s, true, t) != nullptr;
}

void cudnn_attention_forward(Cuda& dev, const FusedAttentionShape& s, attention_dtype t, float scale, const void* q,
                             const void* k, const void* v, const void* bias, void* o, float* stats) {
  auto& st = dev.extension<detail::CudnnAttentionState>();
  const auto* g = st.graph(s, false, t);
  if (g == nullptr)
    throw config_error("cuDNN has no fused attention for this problem (head dim " + std::to_string(s.head_dim) + ", " +
                           std::to_string(s.heads) + " heads, " + std::to_string(s.kv_heads) + " key/value heads)",
                       "check cudnn_attention_supported first, or set DTRAIN_ATTENTION=reference");
  std::unordered_map<detail::fe::graph::Tensor_attributes::uid_t, void*> pack{{detail::uid_q, const_cast<void*>(q)},
                                                                              {detail::uid_k, const_cast<void*>(k)},
                                                                              {detail::uid_v, const_cast<void*>(v)},
                                                                              {detail::uid_o, o},
                                                                              {detail::uid_stats, stats},
                                                                              {detail::uid_scale, &scale}};
  if (s.key_bias) pack[detail::uid_bias] = const_cast<void*>(bias);
  st.run(*g, pack);
}

void cudnn_attention_backward(Cuda& dev, const FusedAttentionShape& s, attention_dtype t, float scale, const void* q,
                              const void* k, const void* v, const void* o, const void* d_o, const float* stats,
                              const void* bias, void* dq, void* dk, void* dv) {
  auto& st = dev.extension<detail::CudnnAttentionState>();
  const auto* g = st.graph(s, true, t);
  if (g == nullptr)
    throw config_error(
        "cuDNN has no fused attention backward for this problem (head dim " + std::to_string(s.head_dim) + ")",
        "check cudnn_attention_supported first, or set DTRAIN_ATTENTION=reference");
  std::unordered_map<detail::fe::graph::Tensor_attributes::uid_t, void*> pack{
      {detail::uid_q, const_cast<void*>(q)},
      {detail::uid_k, const_cast<void*>(k)},
      {detail::uid_v, const_cast<void*>(v)},
      {detail::uid_o, const_cast<void*>(o)},
      {detail::uid_do, const_cast<void*>(d_o)},
      {detail::uid_stats, const_cast<float*>(stats)},
      {detail::uid_dq, dq},
      {detail::uid_dk, dk},
      {detail::uid_dv, dv},
      {detail::uid_scale, &scale}};
  if (s.key_bias) pack[detail::uid_bias] = const_cast<void*>(bias);
  st.run(*g, pack);
}

}  // namespace dtrain

#endif  // DTRAIN_HAS_CUDA && DTRAIN_HAS_CUDNN
