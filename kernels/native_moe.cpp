// Grouped GEMM over experts' weights packed in column blocks, for the CPU (kernels.native_moe).
//
// y[rows of e] = x[rows of e] @ W[e] for every expert e with rows. W is packed as
// [E][N / NB][K][NB] (N padded to a multiple of NB), so one tile of work, an (expert, column
// block) pair, reads its weights as one contiguous stream. Decode routes a few rows to each
// expert, so the step is bound by reading the weights once: each tile keeps up to 8 rows' sums
// in registers while its weights stream past, and the threads split the tiles, not each
// expert's GEMM, so they meet once per call rather than once per expert. Rows and sums are
// float32; weights float32 or bfloat16 (widened as they are read: half the bytes to stream).
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int V = 2;        // 16-float vectors a tile's row spans
constexpr int NB = 16 * V;  // columns a tile
constexpr int MB = 8;       // rows a tile keeps in registers (16 accumulators)
typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t h16 __attribute__((vector_size(32)));
typedef uint32_t u16 __attribute__((vector_size(64)));

inline v16 vec(const float* p) {
  v16 v;
  std::memcpy(&v, p, 64);
  return v;
}
inline v16 vec(const uint16_t* p) {
  h16 h;
  std::memcpy(&h, p, 32);
  u16 bits = __builtin_convertvector(h, u16) << 16;
  v16 v;
  std::memcpy(&v, &bits, 64);
  return v;
}

// e^x to a few float ulps: 2^n e^r with n = round(x / ln 2), |r| <= ln 2 / 2, and Cephes'
// polynomial for e^r. x is clamped to where 2^n stays a normal float's scale.
inline v16 exp16(v16 x) {
  const v16 lo = v16{} - 87.3f, hi = v16{} + 88.3f, shift = v16{} + 12582912.0f;  // 1.5 * 2^23
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const v16 t = x * 1.44269504f + shift;  // n in t's low mantissa bits, rounded to nearest
  const v16 n = t - shift;
  const v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  v16 p = v16{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const v16 e = p * r * r + r + 1.0f;
  u16 tb, eb;
  std::memcpy(&tb, &t, 64);
  std::memcpy(&eb, &e, 64);
  eb += (tb - 0x4B400000u) << 23;
  v16 out;
  std::memcpy(&out, &eb, 64);
  return out;
}

// M rows of x, packed [K][MB], times one packed column block w [K][NB] into acc [M][NB]
template <int M, typename T>
inline void tile(const float* x, const T* w, int64_t K, float* acc) {
  v16 a[M][V];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < V; ++v) a[m][v] = v16{};
  for (int64_t k = 0; k < K; ++k) {
    v16 wv[V];
    for (int v = 0; v < V; ++v) wv[v] = vec(w + k * NB + 16 * v);
    for (int m = 0; m < M; ++m) {
      float s = x[k * MB + m];
      for (int v = 0; v < V; ++v) a[m][v] += s * wv[v];
    }
  }
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < V; ++v) std::memcpy(acc + m * NB + 16 * v, &a[m][v], 64);
}

template <typename T>
void tile_rows(const float* x, const T* w, int64_t K, int mb, float* acc) {
  switch (mb) {
    case 1: return tile<1>(x, w, K, acc);
    case 2: return tile<2>(x, w, K, acc);
    case 3: return tile<3>(x, w, K, acc);
    case 4: return tile<4>(x, w, K, acc);
    case 5: return tile<5>(x, w, K, acc);
    case 6: return tile<6>(x, w, K, acc);
    case 7: return tile<7>(x, w, K, acc);
    default: return tile<8>(x, w, K, acc);
  }
}

// Rows m0.. of one tile's sums acc [mb][NB] into y (row stride N), columns j * NB.. of them.
// GateUp: the block's two vectors are 16 gate and the same 16 up columns, and y gets
// SiLU(gate) * up, 16 columns a block.
template <bool GateUp>
inline void write(const float* acc, int mb, float* y, int64_t N, int64_t j) {
  const int64_t width = GateUp ? 16 : NB, col = j * width;
  const int cols = int(N - col < width ? N - col : width);
  for (int m = 0; m < mb; ++m) {
    float* dst = y + m * N + col;
    if (!GateUp) {
      std::memcpy(dst, acc + m * NB, cols * 4);
      continue;
    }
    const v16 gate = vec(acc + m * NB), up = vec(acc + m * NB + 16);
    const v16 h = gate / (1.0f + exp16(-gate)) * up;
    std::memcpy(dst, &h, cols * 4);
  }
}

// 0, or -1 (nothing written) when an expert's rows are not within x's M rows.
// N: y's columns; with GateUp the packed weights have 2 * 16 columns per 16 of them.
template <bool GateUp, typename T>
int grouped_gemm(const float* x, int64_t M, int64_t K, const T* w, int64_t E, int64_t N,
                 const int32_t* offsets, float* y, int threads) {
  const int64_t width = GateUp ? 16 : NB, blocks = (N + width - 1) / width;
  struct Expert {
    int64_t id, start, end, group;  // group: its first row group's index
  };
  std::vector<Expert> used;
  int64_t groups = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t start = e ? offsets[e - 1] : 0;
    if (offsets[e] > M || start < 0) return -1;
    if (offsets[e] > start) {
      used.push_back({e, start, offsets[e], groups});
      groups += (offsets[e] - start + MB - 1) / MB;
    }
  }
  // x's rows in groups of MB of one expert, each group packed [K][MB]: a tile reads its rows'
  // values at one k from one cache line, where rows K floats apart would share cache sets.
  // Kept per calling thread and grown, never freed: a prefill's worth is megabytes, and
  // fresh pages every call would be faulted in every call.
  thread_local std::vector<float> packed;
  if (packed.size() < size_t(groups * K * MB)) packed.resize(groups * K * MB);
  float* xp = packed.data();
  const int64_t tiles = int64_t(used.size()) * blocks;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t u = 0; u < int64_t(used.size()); ++u)
      for (int64_t m0 = used[u].start, g = used[u].group; m0 < used[u].end; m0 += MB, ++g)
        for (int64_t m = 0; m < MB && m0 + m < used[u].end; ++m)
          for (int64_t k = 0; k < K; ++k) xp[(g * K + k) * MB + m] = x[(m0 + m) * K + k];
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const Expert& e = used[t / blocks];
      const int64_t j = t % blocks;
      const T* wj = w + (e.id * blocks + j) * K * NB;
      float acc[MB * NB];
      for (int64_t m0 = e.start, g = e.group; m0 < e.end; m0 += MB, ++g) {
        const int mb = int(e.end - m0 < MB ? e.end - m0 : MB);
        tile_rows(xp + g * K * MB, wj, K, mb, acc);
        write<GateUp>(acc, mb, y + m0 * N, N, j);
      }
    }
  }
  return 0;
}

}  // namespace

extern "C" {
int native_moe_block() { return NB; }

// float32 or bfloat16 (its bits as uint16) weights; float32 rows and sums
#define ENTRY(name, gate_up, T)                                                               \
  int name(const float* x, int64_t M, int64_t K, const T* w, int64_t E, int64_t N,           \
           const int32_t* offsets, float* y, int threads) {                                  \
    return grouped_gemm<gate_up>(x, M, K, w, E, N, offsets, y, threads);                     \
  }
ENTRY(grouped_gemm_f32, false, float)
ENTRY(grouped_gemm_bf16, false, uint16_t)
ENTRY(grouped_gate_up_f32, true, float)
ENTRY(grouped_gate_up_bf16, true, uint16_t)
}
