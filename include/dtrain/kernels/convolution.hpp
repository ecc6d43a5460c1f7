#pragma once
// Functors of the 2-D convolution (nn/convolution.hpp) and the vision
// transformer's patch tokens (nn/patch_embedding.hpp), applied with
// dev.for_each like every other kernel, so the host and the GPU run the same
// code.
//
// A convolution runs as GEMMs over a column matrix (im2col): images are NCHW,
// [batch, channels, height, width] row-major, and the columns of all images
// are laid out [groups][K][batch * P], K = channels / groups * kernel_h *
// kernel_w, P = out_h * out_w, so one strided batched GEMM over the groups
// multiplies every image at once, and the weight gradient's sum over images
// is the GEMM's own sum over its inner dimension. The GEMM's result is then
// [out_channels][batch * P], which ToSamples turns into NCHW.

#include <cstddef>
#include <cstdint>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain {

// The shape of one convolution over a batch of images (no dilation).
struct ConvShape {
  std::int64_t batch, channels, height, width;
  std::int64_t out_channels, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, groups;

  DTRAIN_HOST_DEVICE std::int64_t out_h() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  DTRAIN_HOST_DEVICE std::int64_t out_w() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
  DTRAIN_HOST_DEVICE std::int64_t positions() const { return out_h() * out_w(); }  // P
  DTRAIN_HOST_DEVICE std::int64_t group_channels() const { return channels / groups; }
  DTRAIN_HOST_DEVICE std::int64_t group_out() const { return out_channels / groups; }
  // K: the rows of one group's column matrix (and the columns of its weight)
  DTRAIN_HOST_DEVICE std::int64_t col_rows() const { return group_channels() * kernel_h * kernel_w; }
  DTRAIN_HOST_DEVICE std::int64_t col_cols() const { return batch * positions(); }
  DTRAIN_HOST_DEVICE std::int64_t col_size() const { return groups * col_rows() * col_cols(); }
  DTRAIN_HOST_DEVICE std::int64_t input_size() const { return batch * channels * height * width; }
  DTRAIN_HOST_DEVICE std::int64_t output_size() const { return batch * out_channels * positions(); }
};

// col[g][k][n * P + p] = x[n, c, ih, iw] (0 in the padding), where k picks
// channel c of group g and kernel offset (r, s), and p output position
// (oh, ow): ih = oh * stride_h - pad_h + r. Run over s.col_size().
template <Dtype T>
struct Im2Col {
  ConvShape s;
  const T* x;
  T* col;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t cols = s.col_cols(), k_all = idx / cols, j = idx % cols;
    const std::int64_t g = k_all / s.col_rows(), k = k_all % s.col_rows();
    const std::int64_t c = g * s.group_channels() + k / (s.kernel_h * s.kernel_w);
    const std::int64_t r = (k / s.kernel_w) % s.kernel_h, q = k % s.kernel_w;
    const std::int64_t n = j / s.positions(), p = j % s.positions();
    const std::int64_t ih = (p / s.out_w()) * s.stride_h - s.pad_h + r;
    const std::int64_t iw = (p % s.out_w()) * s.stride_w - s.pad_w + q;
    const bool inside = ih >= 0 && ih < s.height && iw >= 0 && iw < s.width;
    col[idx] = inside ? x[((n * s.channels + c) * s.height + ih) * s.width + iw] : dtype_cast<T>(0.f);
  }
};

// Im2Col a column-matrix row segment at a time, for the host: index i is
// (g, k, n), and its P entries col[g][k][n * P + p] are written in order,
// the divisions done once per row instead of once per entry. Run over
// groups * col_rows() * batch.
template <Dtype T>
struct Im2ColRows {
  ConvShape s;
  const T* x;
  T* col;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t n = idx % s.batch, k_all = idx / s.batch;
    const std::int64_t g = k_all / s.col_rows(), k = k_all % s.col_rows();
    const std::int64_t c = g * s.group_channels() + k / (s.kernel_h * s.kernel_w);
    const std::int64_t r = (k / s.kernel_w) % s.kernel_h, q = k % s.kernel_w;
    const std::int64_t oh_n = s.out_h(), ow_n = s.out_w();
    const T* plane = x + (n * s.channels + c) * s.height * s.width;
    T* out = col + k_all * s.col_cols() + n * s.positions();
    for (std::int64_t oh = 0; oh < oh_n; ++oh) {
      const std::int64_t ih = oh * s.stride_h - s.pad_h + r;
      T* row = out + oh * ow_n;
      if (ih < 0 || ih >= s.height) {
        for (std::int64_t ow = 0; ow < ow_n; ++ow) row[ow] = dtype_cast<T>(0.f);
        continue;
      }
      const T* in = plane + ih * s.width;
      for (std::int64_t ow = 0; ow < ow_n; ++ow) {
        const std::int64_t iw = ow * s.stride_w - s.pad_w + q;
        row[ow] = iw >= 0 && iw < s.width ? in[iw] : dtype_cast<T>(0.f);
      }
    }
  }
  std::size_t work_per_index() const { return static_cast<std::size_t>(s.positions()); }
};

// Im2Col on `dev`: rows on the host, an entry per index on a GPU.
template <class Dev, class T>
void im2col(Dev& dev, const ConvShape& s, const T* x, T* col) {
  if constexpr (Dev::host_accessible)
    dev.for_each(static_cast<std::size_t>(s.groups * s.col_rows() * s.batch), Im2ColRows<T>{s, x, col});
  else
    dev.for_each(static_cast<std::size_t>(s.col_size()), Im2Col<T>{s, x, col});
}

// The adjoint of Im2Col: dx[n, c, ih, iw] = the sum of the column entries
// Im2Col copied x[n, c, ih, iw] to, gathered per input element (no atomics:
// deterministic on every device), in fp32, rounded once. Run over
// s.input_size().
template <Dtype T>
struct Col2Im {
  ConvShape s;
  const T* dcol;
  T* dx;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t iw = idx % s.width, ih = (idx / s.width) % s.height;
    const std::int64_t c = (idx / (s.width * s.height)) % s.channels, n = idx / (s.width * s.height * s.channels);
    const std::int64_t g = c / s.group_channels(), cl = c % s.group_channels();
    const std::int64_t cols = s.col_cols(), oh_n = s.out_h(), ow_n = s.out_w();
    float acc = 0.f;
    for (std::int64_t r = 0; r < s.kernel_h; ++r) {
      const std::int64_t h = ih + s.pad_h - r;  // = oh * stride_h when (oh, r) reads this row
      if (h < 0 || h % s.stride_h != 0 || h / s.stride_h >= oh_n) continue;
      for (std::int64_t q = 0; q < s.kernel_w; ++q) {
        const std::int64_t w = iw + s.pad_w - q;
        if (w < 0 || w % s.stride_w != 0 || w / s.stride_w >= ow_n) continue;
        const std::int64_t k = (cl * s.kernel_h + r) * s.kernel_w + q;
        const std::int64_t j = n * s.positions() + (h / s.stride_h) * ow_n + w / s.stride_w;
        acc += static_cast<float>(dcol[(g * s.col_rows() + k) * cols + j]);
      }
    }
    dx[idx] = dtype_cast<T>(acc);
  }
};

// [out_channels][batch * P] (the GEMM's layout) <-> [batch][out_channels][P]
// (NCHW): to_samples moves the GEMM's result into the output, otherwise the
// output gradient into the GEMM's layout. Run over s.output_size().
template <Dtype T>
struct ToSamples {
  ConvShape s;
  const T* src;
  T* dst;
  bool to_samples;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i), p_all = s.positions();
    const std::int64_t p = idx % p_all, o = (idx / p_all) % s.out_channels, n = idx / (p_all * s.out_channels);
    const std::int64_t gemm = (o * s.batch + n) * p_all + p;
    if (to_samples)
      dst[idx] = src[gemm];
    else
      dst[gemm] = src[idx];
  }
};

// Col2Im a plane at a time, for the host: index i is (n, c), whose plane
// gathers its column entries into an fp32 buffer on the stack, a strip of
// rows at a time, kernel offset (r, s) by offset in the order Col2Im sums
// them: the same sums, rounded once. Rows wider than the buffer take
// Col2Im's gather element by element. Run over batch * channels.
template <Dtype T>
struct Col2ImPlanes {
  static constexpr std::int64_t buffer = 2048;  // floats
  ConvShape s;
  const T* dcol;
  T* dx;
  void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t plane = s.height * s.width;
    T* out = dx + idx * plane;
    if (s.width > buffer) {
      const Col2Im<T> one{s, dcol, dx};
      for (std::int64_t p = 0; p < plane; ++p) one(static_cast<std::size_t>(idx * plane + p));
      return;
    }
    const std::int64_t c = idx % s.channels, n = idx / s.channels;
    const std::int64_t g = c / s.group_channels(), cl = c % s.group_channels();
    const std::int64_t oh_n = s.out_h(), ow_n = s.out_w(), strip = buffer / s.width;
    float acc[buffer];
    for (std::int64_t h0 = 0; h0 < s.height; h0 += strip) {
      const std::int64_t h1 = h0 + strip < s.height ? h0 + strip : s.height;
      for (std::int64_t e = 0; e < (h1 - h0) * s.width; ++e) acc[e] = 0.f;
      for (std::int64_t r = 0; r < s.kernel_h; ++r)
        for (std::int64_t q = 0; q < s.kernel_w; ++q) {
          const std::int64_t k = (cl * s.kernel_h + r) * s.kernel_w + q;
          const T* row = dcol + (g * s.col_rows() + k) * s.col_cols() + n * s.positions();
          for (std::int64_t oh = 0; oh < oh_n; ++oh) {
            const std::int64_t ih = oh * s.stride_h - s.pad_h + r;
            if (ih < h0 || ih >= h1) continue;
            float* o = acc + (ih - h0) * s.width;
            for (std::int64_t ow = 0; ow < ow_n; ++ow) {
              const std::int64_t iw = ow * s.stride_w - s.pad_w + q;
              if (iw >= 0 && iw < s.width) o[iw] += static_cast<float>(row[oh * ow_n + ow]);
            }
          }
        }
      for (std::int64_t e = 0; e < (h1 - h0) * s.width; ++e) out[h0 * s.width + e] = dtype_cast<T>(acc[e]);
    }
  }
  std::size_t work_per_index() const {
    return static_cast<std::size_t>(s.kernel_h * s.kernel_w * s.positions() + s.height * s.width);
  }
};

// Col2Im on `dev`: planes on the host, an element per index on a GPU.
template <class Dev, class T>
void col2im(Dev& dev, const ConvShape& s, const T* dcol, T* dx) {
  if constexpr (Dev::host_accessible)
    dev.for_each(static_cast<std::size_t>(s.batch * s.channels), Col2ImPlanes<T>{s, dcol, dx});
  else
    dev.for_each(static_cast<std::size_t>(s.input_size()), Col2Im<T>{s, dcol, dx});
}

// ToSamples a plane at a time (the host's form): index i is (n, o), its P
// positions contiguous on both sides. Run over batch * out_channels.
template <Dtype T>
struct ToSamplesRows {
  ConvShape s;
  const T* src;
  T* dst;
  bool to_samples;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i), p_all = s.positions();
    const std::int64_t o = idx % s.out_channels, n = idx / s.out_channels;
    const std::int64_t gemm = (o * s.batch + n) * p_all, sample = idx * p_all;
    for (std::int64_t p = 0; p < p_all; ++p) {
      if (to_samples)
        dst[sample + p] = src[gemm + p];
      else
        dst[gemm + p] = src[sample + p];
    }
  }
  std::size_t work_per_index() const { return static_cast<std::size_t>(s.positions()); }
};

// ToSamples on `dev`: planes on the host, an element per index on a GPU.
template <class Dev, class T>
void to_samples(Dev& dev, const ConvShape& s, const T* src, T* dst, bool forward) {
  if constexpr (Dev::host_accessible)
    dev.for_each(static_cast<std::size_t>(s.batch * s.out_channels), ToSamplesRows<T>{s, src, dst, forward});
  else
    dev.for_each(static_cast<std::size_t>(s.output_size()), ToSamples<T>{s, src, dst, forward});
}

// m[r, j] = value[r] for a [rows, cols] matrix: the bias the GEMM then adds
// to (beta = 1), so the output is rounded once. Run over rows * cols.
template <Dtype T>
struct FillRows {
  const T* value;
  T* m;
  std::int64_t cols;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const { m[i] = value[static_cast<std::int64_t>(i) / cols]; }
};

// out[r] = the sum of row r of a [rows, cols] matrix in fp32, rounded once
// (the bias gradient over the GEMM's layout). Run over rows.
template <Dtype T>
struct RowSum {
  const T* m;
  T* out;
  std::int64_t cols;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(cols); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const T* row = m + static_cast<std::int64_t>(i) * cols;
    float acc = 0.f;
    for (std::int64_t j = 0; j < cols; ++j) acc += static_cast<float>(row[j]);
    out[i] = dtype_cast<T>(acc);
  }
};

// A vision transformer's tokens from the patch projection's GEMM result
// proj [dim][batch * patches]: y[n * tokens + t, d] = token + pos[t, d],
// where token is cls[d] for t = 0 with a class token (first = 1), else
// proj[d, n * patches + t - first]. Run over batch * tokens * dim.
template <Dtype T>
struct PatchTokens {
  const T* proj;
  const T* cls;  // null without a class token
  const T* pos;  // [tokens, dim]
  T* y;
  std::int64_t batch, patches, dim;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t first = cls != nullptr ? 1 : 0, tokens = patches + first;
    const std::int64_t d = idx % dim, t = (idx / dim) % tokens, n = idx / (dim * tokens);
    const float token = t < first ? static_cast<float>(cls[d])
                                  : static_cast<float>(proj[d * batch * patches + n * patches + t - first]);
    y[idx] = dtype_cast<T>(token + static_cast<float>(pos[t * dim + d]));
  }
};

// The patch tokens' gradient in the GEMM's layout: dproj[d, n * patches + p]
// = dy[n * tokens + first + p, d]. Run over dim * batch * patches.
template <Dtype T>
struct PatchTokensGrad {
  const T* dy;
  T* dproj;
  std::int64_t batch, patches, dim, first;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i), cols = batch * patches;
    const std::int64_t d = idx / cols, n = (idx % cols) / patches, p = idx % patches;
    dproj[idx] = dy[(n * (patches + first) + first + p) * dim + d];
  }
};

}  // namespace dtrain

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
// clang-format off: one list entry per line
#define DTRAIN_CONVOLUTION_FUNCTORS(EACH, SUM, T) \
  EACH(::dtrain::Im2Col<T>)                       \
  EACH(::dtrain::Im2ColRows<T>)                   \
  EACH(::dtrain::Col2Im<T>)                       \
  EACH(::dtrain::Col2ImPlanes<T>)                 \
  EACH(::dtrain::ToSamples<T>)                    \
  EACH(::dtrain::ToSamplesRows<T>)                \
  EACH(::dtrain::FillRows<T>)                     \
  EACH(::dtrain::RowSum<T>)                       \
  EACH(::dtrain::PatchTokens<T>)                  \
  EACH(::dtrain::PatchTokensGrad<T>)
// clang-format on
