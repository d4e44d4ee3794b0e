// The fused optimizers' element loops: see optimizer_tiles.h.
#include "optim/optimizer_tiles.h"

#include <immintrin.h>

#include <bit>

#include "common/simd.h"

namespace poptorch_sim {
namespace optim {
namespace {


#define POPSIM_INLINE inline __attribute__((always_inline))

// In-place square root of a tile. Written with intrinsics because the compiler keeps `sqrtf`
// scalar (errno) without -fno-math-errno; IEEE square roots are correctly rounded, so both
// variants give identical bits.
struct SqrtBase {
  static POPSIM_INLINE void run(float* x, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
    }
    for (; i < n; ++i) {
      _mm_store_ss(x + i, _mm_sqrt_ss(_mm_load_ss(x + i)));
    }
  }
};

struct SqrtAvx2 {
  POPSIM_AVX2 static void run(float* x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
    }
    for (; i < n; ++i) {
      _mm_store_ss(x + i, _mm_sqrt_ss(_mm_load_ss(x + i)));
    }
  }
};

struct SqrtAvx512 {
  POPSIM_AVX512 static void run(float* x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      // The zero-masked form with every lane on: GCC 12 warns that _mm512_sqrt_ps's
      // undefined pass-through vector "may be used uninitialized".
      _mm512_storeu_ps(x + i, _mm512_maskz_sqrt_ps(0xffff, _mm512_loadu_ps(x + i)));
    }
    for (; i < n; ++i) {
      _mm_store_ss(x + i, _mm_sqrt_ss(_mm_load_ss(x + i)));
    }
  }
};

// Defines NAME(h, v) that runs NAME##_body compiled for the SIMD level (see [Note: SIMD
// variants]), with the gradient unscaled by a division or by an exact reciprocal (see GradPrep).
#define POPSIM_SIMD_VARIANT(NAME, HYPER, SUFFIX, ATTRIBUTE, SQRT)                       \
  static ATTRIBUTE void NAME##SUFFIX(const HYPER& h, const TileView& v) {               \
    if (h.gp.by_inverse) {                                                              \
      NAME##_body<SQRT, true>(h, v);                                                    \
    } else {                                                                            \
      NAME##_body<SQRT, false>(h, v);                                                   \
    }                                                                                   \
  }
#define POPSIM_SIMD_DISPATCH(NAME, HYPER)                                               \
  POPSIM_SIMD_VARIANT(NAME, HYPER, _avx512, POPSIM_AVX512, SqrtAvx512)                  \
  POPSIM_SIMD_VARIANT(NAME, HYPER, _avx2, POPSIM_AVX2, SqrtAvx2)                        \
  POPSIM_SIMD_VARIANT(NAME, HYPER, _base, , SqrtBase)                                   \
  void NAME(const HYPER& h, const TileView& v) {                                        \
    simd::pick(simd::level(simd::Family::kOptimizer), &NAME##_avx512, &NAME##_avx2, &NAME##_base)(h, v);        \
  }

// [Note: options as masks]
// Each element loop is compiled once per SIMD level: the options that guard a store or a
// state's load are template parameters (SGD's momentum, RMSprop's average and momentum, LAMB's
// pass and rounded moments), and the others are bit masks the loop selects with (pick), as the
// vectorised loop does lanewise. GCC 12 does not vectorise `c ? a : b` on a loop-invariant bool
// ("relevant stmt not supported"), and unswitched each such option instead: a copy of each loop
// per combination of options, 16 of this file's 20 CPU s.

// All ones where `on`, else zero.
POPSIM_INLINE uint32_t mask_of(bool on) { return on ? ~uint32_t{0} : 0; }

// `a` where `mask` is all ones, `b` where it is zero: `mask ? a : b`, bit for bit.
POPSIM_INLINE float pick(uint32_t mask, float a, float b) {
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & mask) |
                              (std::bit_cast<uint32_t>(b) & ~mask));
}

// The gradient as the update sees it (see GradPrep); `negate` is the sign bit where maximising.
struct Prep {
  GradPrep gp;
  uint32_t negate;
  explicit Prep(const GradPrep& g) : gp(g), negate(g.maximize ? 0x80000000u : 0u) {}
};

template <bool kByInverse>
POPSIM_INLINE float prep(const Prep& p, float g) {
  if constexpr (kByInverse) {
    g = g * p.gp.inverse;
  } else {
    g = g / p.gp.loss_scaling;
  }
  g = g * p.gp.clip_coef;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(g) ^ p.negate);  // -g where maximising
}

// `other * alpha + self` with one rounding, as ATen's vectorised `add(self, other, alpha)`.
POPSIM_INLINE float add_alpha(float self, float other, float alpha) {
  return __builtin_fmaf(other, alpha, self);
}

// ATen's vectorised lerp by weight w: fma(w or w - 1, end - self, self or end), by |w| < 0.5.
struct Lerp {
  uint32_t small;  // |w| < 0.5
  float weight;    // w or w - 1
  explicit Lerp(float w)
      : small(mask_of(__builtin_fabsf(w) < 0.5f)),
        weight(__builtin_fabsf(w) < 0.5f ? w : w - 1.0f) {}
  POPSIM_INLINE float operator()(float self, float end) const {
    return __builtin_fmaf(weight, end - self, pick(small, self, end));
  }
};

// ---------------------------------------------------------------- SGD


template <bool kByInverse, bool kMomentum>
POPSIM_INLINE void sgd_loop(const SgdHyper h, const TileView v) {
  float* p = v.param;
  float* buf = v.state[0];
  const Prep gp(h.gp);
  const uint32_t decay = mask_of(h.weight_decay != 0.0f);
  const uint32_t first = mask_of(h.first_step);
  const uint32_t nesterov = mask_of(h.nesterov);
  for (int64_t i = 0; i < v.len; ++i) {
    float g = prep<kByInverse>(gp, v.grad[i]);
    g = pick(decay, add_alpha(g, p[i], h.weight_decay), g);
    if constexpr (kMomentum) {
      const float b = pick(first, g, add_alpha(buf[i] * h.momentum, g, h.one_minus_dampening));
      buf[i] = b;
      g = pick(nesterov, add_alpha(g, b, h.momentum), b);
    }
    p[i] = add_alpha(p[i], g, h.neg_lr);
  }
}

template <class Sqrt, bool kByInverse>
POPSIM_INLINE void sgd_tile_body(const SgdHyper h, const TileView v) {
  if (v.state[0] != nullptr) {
    sgd_loop<kByInverse, true>(h, v);
  } else {
    sgd_loop<kByInverse, false>(h, v);
  }
}
}  // namespace

POPSIM_SIMD_DISPATCH(sgd_tile, SgdHyper)

namespace {

// ---------------------------------------------------------------- Adam / AdamW

constexpr int64_t kAdamBlock = 64;


template <class Sqrt, bool kByInverse>
POPSIM_INLINE void adam_tile_body(const AdamHyper h, const TileView v) {
  // Blocks of kAdamBlock elements: the square roots and divisions of one block overlap the
  // loads of the next, where a whole-tile pass of each would leave memory idle meanwhile.
  const Prep gp(h.gp);
  const Lerp lerp(h.lerp_w);
  const uint32_t decoupled = mask_of(h.weight_decay != 0.0f && h.decoupled);
  const uint32_t coupled = mask_of(h.weight_decay != 0.0f && !h.decoupled);
  for (int64_t b = 0; b < v.len; b += kAdamBlock) {
    const int64_t len = std::min(kAdamBlock, v.len - b);
    float* __restrict p = v.param + b;
    float* __restrict m = v.state[0] + b;
    float* __restrict s = v.state[1] + b;
    const float* __restrict grad = v.grad + b;
    float root[kAdamBlock];
    for (int64_t i = 0; i < len; ++i) {
      float g = prep<kByInverse>(gp, grad[i]);
      float w = p[i];
      g = pick(coupled, add_alpha(g, w, h.weight_decay), g);
      w = pick(decoupled, w * h.decay_factor, w);
      m[i] = lerp(m[i], g);
      float si = s[i] * h.beta2;
      si = si + h.one_minus_beta2 * g * g;
      s[i] = si;
      p[i] = w;
      root[i] = si;
    }
    Sqrt::run(root, len);
    for (int64_t i = 0; i < len; ++i) {
      const float denom = root[i] / h.bc2_sqrt + h.eps;
      p[i] = p[i] + h.neg_step * (m[i] / denom);
    }
  }
}
}  // namespace

POPSIM_SIMD_DISPATCH(adam_tile, AdamHyper)

namespace {

// ---------------------------------------------------------------- RMSprop


template <class Sqrt, bool kByInverse, bool kAverage, bool kMomentum>
POPSIM_INLINE void rmsprop_loops(const RmspropHyper h, const TileView v) {
  float* p = v.param;
  float* sq = v.state[0];
  float* buf = kMomentum ? v.state[h.mom_slot] : nullptr;
  float* ga = kAverage ? v.state[h.avg_slot] : nullptr;
  float root[kTile], grad[kTile];
  const Prep gp(h.gp);
  const Lerp lerp(h.one_minus_alpha);
  const uint32_t decay = mask_of(h.weight_decay != 0.0f);
  const uint32_t tf = mask_of(h.tf_variant);
  for (int64_t i = 0; i < v.len; ++i) {
    float g = prep<kByInverse>(gp, v.grad[i]);
    g = pick(decay, add_alpha(g, p[i], h.weight_decay), g);
    float sqi = sq[i] * h.alpha;
    sqi = sqi + h.one_minus_alpha * g * g;
    sq[i] = sqi;
    float var = sqi;
    if constexpr (kAverage) {
      const float gai = lerp(ga[i], g);
      ga[i] = gai;
      var = sqi + -1.0f * gai * gai;
    }
    root[i] = pick(tf, var + h.eps, var);
    grad[i] = g;
  }
  Sqrt::run(root, v.len);
  for (int64_t i = 0; i < v.len; ++i) {
    const float avg = pick(tf, root[i], root[i] + h.eps);
    if constexpr (kMomentum) {
      const float b = buf[i] * h.momentum + grad[i] / avg;
      buf[i] = b;
      p[i] = add_alpha(p[i], b, h.neg_lr);
    } else {
      p[i] = p[i] + h.neg_lr * (grad[i] / avg);
    }
  }
}

template <class Sqrt, bool kByInverse>
POPSIM_INLINE void rmsprop_tile_body(const RmspropHyper h, const TileView v) {
  if (h.avg_slot >= 0) {
    if (h.mom_slot >= 0) {
      rmsprop_loops<Sqrt, kByInverse, true, true>(h, v);
    } else {
      rmsprop_loops<Sqrt, kByInverse, true, false>(h, v);
    }
  } else if (h.mom_slot >= 0) {
    rmsprop_loops<Sqrt, kByInverse, false, true>(h, v);
  } else {
    rmsprop_loops<Sqrt, kByInverse, false, false>(h, v);
  }
}
}  // namespace

POPSIM_SIMD_DISPATCH(rmsprop_tile, RmspropHyper)

namespace {

// ---------------------------------------------------------------- LAMB


// `x` rounded to storage dtype `dt` and widened back: pass 1 must see the moments exactly as
// pass 2 will read them from float16/bfloat16 storage, or the trust ratio would not fit r.
POPSIM_INLINE float stored(float x, at::ScalarType dt) {
  if (dt == at::kHalf) {
    return static_cast<float>(static_cast<at::Half>(x));
  }
  if (dt == at::kBFloat16) {
    return static_cast<float>(static_cast<at::BFloat16>(x));
  }
  return x;
}

// kUpdate: pass 1 (update_moments); kFloat: both moments stored as float32 (no rounding).
template <class Sqrt, bool kByInverse, bool kUpdate, bool kFloat>
POPSIM_INLINE void lamb_loops(const LambHyper h, const TileView v) {
  float* p = v.param;
  float* m = v.state[0];
  float* s = v.state[1];
  float root[kTile];
  const Prep gp(h.gp);
  for (int64_t i = 0; i < v.len; ++i) {
    float si = s[i];
    if constexpr (kUpdate) {
      const float g = prep<kByInverse>(gp, v.grad[i]);
      float mi = add_alpha(m[i] * h.beta1, g, h.one_minus_beta1);
      si = si * h.beta2;
      si = si + h.one_minus_beta2 * g * g;
      if constexpr (!kFloat) {
        mi = stored(mi, h.m_dtype);
        si = stored(si, h.s_dtype);
      }
      m[i] = mi;
      s[i] = si;
    }
    root[i] = si;
  }
  Sqrt::run(root, v.len);
  for (int64_t i = 0; i < v.len; ++i) {
    const float denom = root[i] / h.bc2_sqrt + h.eps;
    const float r = (m[i] / h.bc1) / denom + h.weight_decay * p[i];
    if constexpr (kUpdate) {
      h.r_out[i] = r;
    } else {
      p[i] = add_alpha(p[i], r, h.alpha);
    }
  }
}

template <class Sqrt, bool kByInverse>
POPSIM_INLINE void lamb_tile_body(const LambHyper h, const TileView v) {
  if (!h.update_moments) {
    lamb_loops<Sqrt, kByInverse, false, true>(h, v);
  } else if (h.m_dtype == at::kFloat && h.s_dtype == at::kFloat) {
    lamb_loops<Sqrt, kByInverse, true, true>(h, v);
  } else {
    lamb_loops<Sqrt, kByInverse, true, false>(h, v);
  }
}
}  // namespace

POPSIM_SIMD_DISPATCH(lamb_tile, LambHyper)

namespace {

// ---------------------------------------------------------------- reductions

POPSIM_INLINE double sum_squares_body(const float* x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const double d = x[i + l];
      acc[l] += d * d;
    }
  }
  for (int l = 0; i < n; ++i, ++l) {
    const double d = x[i];
    acc[l] += d * d;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

POPSIM_AVX512 double sum_squares_avx512(const float* x, int64_t n) {
  return sum_squares_body(x, n);
}
POPSIM_AVX2 double sum_squares_avx2(const float* x, int64_t n) { return sum_squares_body(x, n); }
double sum_squares_base(const float* x, int64_t n) { return sum_squares_body(x, n); }

}  // namespace

double sum_squares(const float* x, int64_t n) {
  return simd::pick(simd::level(simd::Family::kOptimizer), &sum_squares_avx512, &sum_squares_avx2,
                    &sum_squares_base)(x, n);
}

}  // namespace optim
}  // namespace poptorch_sim
